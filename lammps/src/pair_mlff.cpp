/* pair_style mlff: energies, forces and virial of an mlff-distiller PaiNN student.

   A message-passing model's energy of an atom depends on atoms up to blocks x cutoff away (its
   receptive field), not just the cutoff. So the style asks LAMMPS for ghost atoms out to the
   receptive field (init_one returns it, and no neighbour list is requested: the engine builds
   its own over local + ghost atoms), counts the energies of local atoms only, and returns
   forces on ghosts too, which LAMMPS adds back to their owners (newton_pair on). Summed over
   ranks this is exactly the energy, forces and virial of the whole system. Along a periodic
   axis that LAMMPS does not divide between ranks the engine takes the images from the cell
   instead of ghost copies (on one rank with a periodic box: no ghosts at all).

   With `exchange features` the ghosts reach one cutoff only, and the blocks run one at a time
   with the features of local atoms sent to their ghost copies between blocks (forward
   communication) and, backward, the gradients on ghosts summed onto their owners (reverse
   communication): no rank computes a ghost shell of the receptive field. */

#include "pair_mlff.h"

#include "atom.h"
#include "comm.h"
#include "domain.h"
#include "error.h"
#include "force.h"
#include "memory.h"
#include "neighbor.h"
#include "update.h"
#include "utils.h"

#include "mlff.h"

#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstring>

using namespace LAMMPS_NS;

PairMLFF::PairMLFF(LAMMPS *lmp) : Pair(lmp)
{
  single_enable = 0;
  restartinfo = 0;
  one_coeff = 1;
  manybody_flag = 1;
  // The virial comes from the engine (the sum over the edges it saw of r (x) F).
  no_virial_fdotr_compute = 1;
  centroidstressflag = CENTROID_NOTAVAIL;
}

PairMLFF::~PairMLFF()
{
  mlff_model_free(model);
  if (allocated) {
    memory->destroy(setflag);
    memory->destroy(cutsq);
  }
}

void PairMLFF::fail_all(const std::string &what)
{
  error->all(FLERR, "pair_style mlff: " + what);
  std::abort();    // not reached: error->all does not return
}

void PairMLFF::allocate()
{
  allocated = 1;
  const int n = atom->ntypes;
  memory->create(setflag, n + 1, n + 1, "pair:setflag");
  memory->create(cutsq, n + 1, n + 1, "pair:cutsq");
  for (int i = 1; i <= n; i++)
    for (int j = i; j <= n; j++) setflag[i][j] = 0;
}

/* pair_style mlff [device cpu|cuda|cuda:N|auto] [dtype f32|f64] [exchange ghosts|features] */
void PairMLFF::settings(int narg, char **arg)
{
  for (int k = 0; k < narg; k += 2) {
    const std::string key = arg[k];
    if (k + 1 >= narg) fail_all("keyword `" + key + "` needs a value");
    const std::string value = arg[k + 1];
    if (key == "device") {
      device = value;
    } else if (key == "dtype") {
      if (value == "f32" || value == "float32")
        dtype_bits = 32;
      else if (value == "f64" || value == "float64")
        dtype_bits = 64;
      else
        fail_all("dtype `" + value + "` is not f32 or f64");
    } else if (key == "exchange") {
      if (value == "ghosts")
        layered = false;
      else if (value == "features")
        layered = true;
      else
        fail_all("exchange `" + value + "` is not ghosts or features");
    } else {
      fail_all("unknown keyword `" + key + "` (expected device, dtype or exchange)");
    }
  }
  // Layered: every ghost is an atom the engine sees, so LAMMPS's sum of x (x) f is the virial.
  no_virial_fdotr_compute = layered ? 0 : 1;
}

/* A bare `cuda` (or `auto` where there are GPUs) puts each rank of a node on its own GPU,
   round robin: one rank per GPU. */
std::string PairMLFF::device_for_this_rank() const
{
  if (device != "cuda" && device != "gpu" && device != "auto") return device;
  // Collective on every rank, whatever its node has.
  MPI_Comm node;
  MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, comm->me, MPI_INFO_NULL, &node);
  int local_rank = 0;
  MPI_Comm_rank(node, &local_rank);
  MPI_Comm_free(&node);
  const int gpus = mlff_cuda_device_count();
  if (gpus <= 0) return device;    // auto: the CPU; cuda: the engine's error says why
  return "cuda:" + std::to_string(local_rank % gpus);
}

/* pair_coeff * * MODEL.safetensors E1 E2 ... (one element symbol per atom type) */
void PairMLFF::coeff(int narg, char **arg)
{
  if (!allocated) allocate();
  const int ntypes = atom->ntypes;
  if (narg < 3 || std::strcmp(arg[0], "*") != 0 || std::strcmp(arg[1], "*") != 0)
    fail_all("expected pair_coeff * * MODEL.safetensors followed by one element per atom type");
  if (narg - 3 != ntypes)
    fail_all(fmt::format("pair_coeff gives {} element(s) for {} atom type(s); give one element "
                         "symbol per type, in type order (pair_coeff * * MODEL H O ...)",
                         narg - 3, ntypes));

  model_path = arg[2];
  mlff_model_free(model);
  model = nullptr;
  const std::string dev = device_for_this_rank();
  // One rank may fail where others do not (its GPU): it stops the run alone.
  if (mlff_model_load(model_path.c_str(), dev.c_str(), dtype_bits, &model) != MLFF_OK)
    error->one(FLERR, fmt::format("pair_style mlff: cannot load {} on {}: {}", model_path, dev,
                                  mlff_last_error()));

  std::vector<int32_t> known(mlff_model_n_elements(model));
  mlff_model_elements(model, known.data());
  std::string known_list;
  for (int32_t z : known) known_list += " " + std::to_string(z);

  type_z.assign(ntypes + 1, 0);
  for (int t = 1; t <= ntypes; t++) {
    const char *symbol = arg[2 + t];
    const int z = mlff_atomic_number(symbol);
    if (z == 0)
      fail_all(fmt::format("`{}` (atom type {}) is not an element symbol", symbol, t));
    bool found = false;
    for (int32_t k : known) found = found || (k == z);
    if (!found)
      fail_all(fmt::format("element {} (Z={}, atom type {}) is not among the elements of {} "
                           "(atomic numbers{})",
                           symbol, z, t, model_path, known_list));
    type_z[t] = z;
  }
  for (int i = 1; i <= ntypes; i++)
    for (int j = i; j <= ntypes; j++) setflag[i][j] = 1;
  receptive_field = mlff_model_receptive_field(model);
  width = mlff_layered_width(model);
  if (comm->me == 0) {
    std::string types;
    for (int t = 1; t <= ntypes; t++) types += fmt::format(" {}={}", t, arg[2 + t]);
    utils::logmesg(lmp,
                   "pair_style mlff: {} (mlff {}) on {}, f{}: cutoff {} Å, {} blocks, "
                   "receptive field {} Å; exchange {}; types{}\n",
                   model_path, mlff_version(), dev, dtype_bits, mlff_model_cutoff(model),
                   mlff_model_n_blocks(model), receptive_field,
                   layered ? "features" : "ghosts", types);
  }
}

void PairMLFF::init_style()
{
  if (!model) fail_all("no model: pair_coeff * * MODEL.safetensors E1 E2 ... comes first");
  if (force->newton_pair == 0)
    fail_all("needs newton_pair on (forces on ghost atoms go back to their owners)");
  if (std::strcmp(update->unit_style, "metal") != 0)
    fail_all(fmt::format("needs units metal (Å, eV, ps), not units {}", update->unit_style));
  // No neighbour list is requested: the engine builds its own over local and ghost atoms.

  // A periodic axis that is not divided between ranks needs no ghosts: the engine takes its
  // images from the cell (on one rank with a periodic box, no ghosts at all).
  const bool brick = comm->style == Comm::BRICK;
  ghosts_needed = false;
  for (int d = 0; d < 3; d++) {
    const bool undivided = brick ? comm->procgrid[d] == 1 : comm->nprocs == 1;
    cell_axes[d] = domain->periodicity[d] && undivided && !layered;
    ghosts_needed = ghosts_needed || !undivided;
  }
  seen_build = -1;
  // Layered: the blocks' features and their gradients travel with LAMMPS's communication.
  comm_forward = comm_reverse = layered ? width : 0;

  // Brick communication brings ghosts from as many periodic images as the cutoff needs; tiled
  // communication cannot reach past one box length (LAMMPS stops, without saying why so far).
  // The ghosts reach the receptive field, or one cutoff where the blocks exchange features;
  // an axis whose images the engine takes from the cell needs none.
  if (comm->style == Comm::TILED) {
    const double reach = layered ? mlff_model_cutoff(model) : receptive_field;
    const double need = reach + neighbor->skin;
    const double *h = domain->h;    // xprd, yprd, zprd, yz, xz, xy
    const double volume = h[0] * h[1] * h[2];
    const double widths[3] = {volume / std::sqrt(h[1] * h[1] * h[2] * h[2] +
                                                h[5] * h[5] * h[2] * h[2] +
                                                std::pow(h[5] * h[3] - h[1] * h[4], 2)),
                             volume / std::sqrt(h[0] * h[0] * (h[2] * h[2] + h[3] * h[3])),
                             h[2]};
    const std::string what =
        layered ? fmt::format("cutoff ({} Å", mlff_model_cutoff(model))
                : fmt::format("receptive field ({} blocks x {} Å = {} Å",
                              mlff_model_n_blocks(model), mlff_model_cutoff(model),
                              receptive_field);
    const char *axis = "xyz";
    for (int d = 0; d < 3; d++)
      if (domain->periodicity[d] && !cell_axes[d] && need > widths[d])
        fail_all(fmt::format("the model's {}, plus the {} Å skin) is larger than the box's "
                             "{:.4g} Å width along {}: comm_style tiled cannot bring ghost "
                             "atoms that far (use comm_style brick, or a larger box)",
                             what, neighbor->skin, widths[d], axis[d]));
  }
}

/* The ghost cutoff this style needs: the model's receptive field, so that LAMMPS brings ghost
   atoms out to blocks x cutoff (plus the skin); on a single rank none are needed. */
double PairMLFF::init_one(int, int)
{
  return ghosts_needed && !layered ? receptive_field : mlff_model_cutoff(model);
}

/* The atoms the engine sees: all local atoms, and the ghosts that are not copies along an axis
   whose images the engine takes from the cell. Chosen right after a neighbour-list build, when
   every local atom lies in the box: then a ghost is such a copy exactly when it lies outside
   the box along that axis. Between builds the same atoms are kept. */
void PairMLFF::choose_atoms()
{
  const int nlocal = atom->nlocal;
  const int nall = nlocal + atom->nghost;
  seen.clear();
  for (int i = 0; i < nlocal; i++) seen.push_back(i);
  const bool filter = cell_axes[0] || cell_axes[1] || cell_axes[2];
  double **x = atom->x;
  for (int i = nlocal; i < nall; i++) {
    bool keep = true;
    if (filter) {
      double lamda[3];
      if (domain->triclinic) {
        domain->x2lamda(x[i], lamda);
      } else {
        for (int d = 0; d < 3; d++) lamda[d] = (x[i][d] - domain->boxlo[d]) / domain->prd[d];
      }
      for (int d = 0; d < 3; d++)
        if (cell_axes[d] && (lamda[d] < 0.0 || lamda[d] >= 1.0)) keep = false;
    }
    if (keep) seen.push_back(i);
  }
  seen_build = neighbor->ncalls;
  seen_nall = nall;
}

/* Positions and atomic numbers of the atoms the engine sees (`seen`, chosen again after a
   neighbour-list build); their number. */
int PairMLFF::load_atoms()
{
  const int nall = atom->nlocal + atom->nghost;
  if (neighbor->ncalls != seen_build || nall != seen_nall) choose_atoms();
  const int n = (int) seen.size();
  double **x = atom->x;
  int *type = atom->type;
  positions.resize(3 * (size_t) n);
  numbers.resize(n);
  for (int k = 0; k < n; k++) {
    const int i = seen[k];
    positions[3 * k] = x[i][0];
    positions[3 * k + 1] = x[i][1];
    positions[3 * k + 2] = x[i][2];
    numbers[k] = type_z[type[i]];
  }
  return n;
}

/* The engine's forces (rows of `forces`, one per atom seen) added to LAMMPS's. */
void PairMLFF::add_forces()
{
  double **f = atom->f;
  for (size_t k = 0; k < seen.size(); k++) {
    const int i = seen[k];
    f[i][0] += forces[3 * k];
    f[i][1] += forces[3 * k + 1];
    f[i][2] += forces[3 * k + 2];
  }
}

void PairMLFF::compute(int eflag, int vflag)
{
  ev_init(eflag, vflag);
  if (vflag_atom)
    error->all(FLERR, "pair_style mlff: per-atom virials (compute stress/atom) are not "
                      "available: a message-passing energy does not split into pair terms");

  if (layered) {
    compute_layered();
    return;
  }
  const int nlocal = atom->nlocal;
  const int n = load_atoms();
  forces.resize(3 * (size_t) n);
  atom_energies.resize(nlocal);

  const bool periodic = cell_axes[0] || cell_axes[1] || cell_axes[2];
  const double *h = domain->h;    // xprd, yprd, zprd, yz, xz, xy
  const double cell[9] = {h[0], 0.0, 0.0, h[5], h[1], 0.0, h[4], h[3], h[2]};
  double energy = 0.0;
  double w[9];
  const mlff_status status =
      mlff_compute(model, n, nlocal, positions.data(), numbers.data(),
                   periodic ? cell : nullptr, periodic ? cell_axes : nullptr, &energy,
                   eflag_atom ? atom_energies.data() : nullptr, forces.data(), w);
  check(status);

  add_forces();
  if (eflag_global) eng_vdwl += energy;
  if (eflag_atom)
    for (int i = 0; i < nlocal; i++) eatom[i] += atom_energies[i];
  if (vflag_global) {
    virial[0] += w[0];    // xx
    virial[1] += w[4];    // yy
    virial[2] += w[8];    // zz
    // A domain's share need not be symmetric; the sum over domains is, to rounding.
    virial[3] += 0.5 * (w[1] + w[3]);    // xy
    virial[4] += 0.5 * (w[2] + w[6]);    // xz
    virial[5] += 0.5 * (w[5] + w[7]);    // yz
  }
}

double PairMLFF::memory_usage()
{
  return Pair::memory_usage() + numbers.capacity() * sizeof(int32_t) +
      seen.capacity() * sizeof(int) +
      (positions.capacity() + forces.capacity() + atom_energies.capacity() +
       features.capacity()) * sizeof(double);
}

/* exchange features: ghosts out to one cutoff, and between blocks the local atoms' features go
   to their ghost copies (forward communication) and, in the backward pass, the gradients on
   ghosts back to their owners (reverse communication). Each rank computes its own atoms only;
   every ghost is passed to the engine as an atom (no cell), so the virial is LAMMPS's
   sum over atoms of x (x) f. */
void PairMLFF::compute_layered()
{
  const int nlocal = atom->nlocal;
  // No cell axes here: the atoms seen are every local and ghost atom, in LAMMPS's order.
  const int nall = load_atoms();
  check(mlff_layered_begin(model, nall, nlocal, positions.data(), numbers.data()));
  const size_t w = width;
  features.resize((size_t) nall * w);
  double *local = features.data();
  double *ghost = features.data() + (size_t) nlocal * w;
  const int blocks = mlff_model_n_blocks(model);
  for (int k = 0; k < blocks; k++) {
    check(mlff_layered_forward(model, k == 0 ? nullptr : ghost, local));
    if (k + 1 < blocks) comm->forward_comm(this);
  }
  double energy = 0.0;
  atom_energies.resize(nlocal);
  check(mlff_layered_energy(model, &energy, atom_energies.data()));
  for (int k = blocks - 1; k >= 0; k--) {
    check(mlff_layered_backward(model, k == blocks - 1 ? nullptr : local, ghost));
    if (k > 0) {
      // The owners' rows receive the sum of their ghosts' gradients.
      std::fill(features.begin(), features.begin() + (size_t) nlocal * w, 0.0);
      comm->reverse_comm(this);
    }
  }
  forces.resize(3 * (size_t) nall);
  check(mlff_layered_forces(model, forces.data()));
  add_forces();
  if (eflag_global) eng_vdwl += energy;
  if (eflag_atom)
    for (int i = 0; i < nlocal; i++) eatom[i] += atom_energies[i];
  if (vflag_fdotr) virial_fdotr_compute();
}

void PairMLFF::check(int status)
{
  if (status != MLFF_OK)
    error->one(FLERR, fmt::format("pair_style mlff: step {}, rank {}: {}", update->ntimestep,
                                  comm->me, mlff_last_error()));
}

int PairMLFF::pack_forward_comm(int n, int *list, double *buf, int, int *)
{
  const size_t w = width;
  for (int i = 0; i < n; i++)
    std::copy_n(features.data() + (size_t) list[i] * w, w, buf + (size_t) i * w);
  return n * width;
}

void PairMLFF::unpack_forward_comm(int n, int first, double *buf)
{
  const size_t w = width;
  std::copy_n(buf, (size_t) n * w, features.data() + (size_t) first * w);
}

int PairMLFF::pack_reverse_comm(int n, int first, double *buf)
{
  const size_t w = width;
  std::copy_n(features.data() + (size_t) first * w, (size_t) n * w, buf);
  return n * width;
}

void PairMLFF::unpack_reverse_comm(int n, int *list, double *buf)
{
  const size_t w = width;
  for (int i = 0; i < n; i++) {
    double *row = features.data() + (size_t) list[i] * w;
    for (size_t c = 0; c < w; c++) row[c] += buf[(size_t) i * w + c];
  }
}

