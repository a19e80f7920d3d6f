/* mlff.h: the C interface to mlff-distiller's PaiNN students (libmlff_capi).
 *
 * Units as ASE and LAMMPS `units metal`: Å, eV, eV/Å. A model is loaded once onto a device and
 * keeps its weights and buffers there between calls. Every function that can fail returns an
 * mlff_status; on failure mlff_last_error() gives a message naming the cause (the file, the
 * atom, the argument). No Rust types cross this boundary and nothing here panics across it.
 *
 * A model handle may be used from one thread at a time. */
#ifndef MLFF_H
#define MLFF_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
  MLFF_OK = 0,
  /* A null pointer, a negative count, an unknown device or dtype. */
  MLFF_ERROR_ARGUMENT = 1,
  /* The checkpoint cannot be read or is not a PaiNN student. */
  MLFF_ERROR_MODEL = 2,
  /* Atoms the model cannot take: an element it does not know, a non-finite position. */
  MLFF_ERROR_INPUT = 3,
  /* The device cannot be opened (no CUDA in this build, no such GPU). */
  MLFF_ERROR_DEVICE = 4,
  /* The computation failed or gave non-finite energies or forces (overlapping atoms). */
  MLFF_ERROR_COMPUTE = 5,
  /* A bug inside the library: please report it with the message. */
  MLFF_ERROR_INTERNAL = 6
} mlff_status;

typedef struct mlff_model mlff_model;

/* The message of the last failed call on this thread ("" when none); valid until the next call
 * on this thread. */
const char *mlff_last_error(void);

/* The library's version, e.g. "0.1.0". */
const char *mlff_version(void);

/* Number of CUDA devices this build and machine have (0 without the `cuda` feature). */
int mlff_cuda_device_count(void);

/* The atomic number of an element symbol ("O", "Cl"; case ignored), 0 when it is none. */
int mlff_atomic_number(const char *symbol);

/* Loads a checkpoint (.safetensors) onto `device` ("cpu", "cuda", "cuda:N" or "auto") in
 * `dtype_bits` 32 or 64. On success *out is a handle to free with mlff_model_free. */
mlff_status mlff_model_load(const char *path, const char *device, int dtype_bits,
                            mlff_model **out);

/* Frees a handle from mlff_model_load (null is allowed). */
void mlff_model_free(mlff_model *model);

/* The model's interaction cutoff in Å. */
double mlff_model_cutoff(const mlff_model *model);

/* Its number of message-passing blocks. */
int mlff_model_n_blocks(const mlff_model *model);

/* Blocks x cutoff in Å: how far a local atom's energy can feel another atom, so how far ghost
 * atoms must reach for a domain's energy and forces to be exact. */
double mlff_model_receptive_field(const mlff_model *model);

/* Its number of elements; mlff_model_elements writes their atomic numbers to `numbers`
 * (room for mlff_model_n_elements values). */
int mlff_model_n_elements(const mlff_model *model);
mlff_status mlff_model_elements(const mlff_model *model, int32_t *numbers);

/* One domain of a (possibly periodic) system: `n_all` atoms, the first `n_local` owned here and
 * the rest ghosts (copies of atoms owned elsewhere, periodic images included), which should
 * reach mlff_model_receptive_field from every local atom. The neighbour list is built inside
 * and kept, with the inputs on the device, while no atom moves more than half its skin and the
 * atoms are those of the last build (skin 0 on the CPU, 1 Å on CUDA; the tuning key
 * domain_skin, e.g. MLFF_TUNING=domain_skin=0.5 in the environment).
 *
 *   positions      [n_all * 3] Å, row-major
 *   numbers        [n_all] atomic numbers
 *   cell, pbc      both null: no cell, ghosts stand for every periodic image. Or cell [9]
 *                  (rows a, b, c in Å) and pbc [3] (0/1): along a periodic axis the images come
 *                  from the cell and no ghost copies along it may be passed (an axis not divided
 *                  between ranks; with every axis periodic and n_local == n_all, a whole cell).
 *   energy         (out) the sum of the local atoms' energies, eV
 *   atom_energies  (out, may be null) [n_local] energy of each local atom, eV
 *   forces         (out, may be null) [n_all * 3] -dE/dx on every atom, ghosts included (add
 *                  a ghost's force to its owner: LAMMPS's reverse communication), eV/Å
 *   virial         (out, may be null) [9] row-major W = sum over the domain's edges of
 *                  r (x) F, eV (without a cell, the sum over its atoms of x (x) f): this
 *                  domain's share of the system's -dE/d(strain) = -V sigma, whose symmetric part
 *                  the shares add up to; LAMMPS's virial[] is xx, yy, zz, xy, xz, yz.
 *
 * Over all domains the energies, the forces (summed onto owners) and the virials add up to the
 * whole system's. */
mlff_status mlff_compute(mlff_model *model, int64_t n_all, int64_t n_local,
                         const double *positions, const int32_t *numbers, const double *cell,
                         const int32_t *pbc, double *energy, double *atom_energies,
                         double *forces, double *virial);

/* Layered domains: ghosts out to one cutoff instead of the receptive field, the blocks'
 * features exchanged between domains by the caller (LAMMPS's forward and reverse
 * communication). Each domain then computes its own atoms only, at the price of
 * 2 (blocks - 1) exchanges of `width` numbers per ghost atom. One call of the model:
 *
 *   mlff_layered_begin                  the atoms: n_local owned, then the ghosts (every atom
 *                                       within the cutoff of a local one, periodic images as
 *                                       ghost copies; no cell)
 *   mlff_layered_forward  x blocks      block 0 takes ghosts = null; block k > 0 the ghosts'
 *                                       outputs of block k - 1 from their owners
 *                                       [n_ghost * width]. Writes the local atoms' outputs
 *                                       [n_local * width] for the domains holding them as ghosts.
 *   mlff_layered_energy                 the local atoms' energies
 *   mlff_layered_backward x blocks      the last block takes received = null; block k < last the
 *                                       sum of what the other domains' backward of block k + 1
 *                                       wrote for this domain's atoms [n_local * width]. Writes
 *                                       the gradient on its ghosts' inputs [n_ghost * width]
 *                                       for their owners (nothing for block 0).
 *   mlff_layered_forces                 -dE/dx on every atom [n_all * 3], ghosts' for their
 *                                       owners; the virial is the sum over atoms of x (x) f.
 *
 * Over all domains the energies and the forces (summed onto owners) add up to the whole
 * system's. Runs on the engine's autograd path. A call out of order fails, its message naming
 * what must come first. */

/* Numbers per atom in an exchange: 4 x the model's features (s, then v's x, y, z rows). */
int mlff_layered_width(const mlff_model *model);

mlff_status mlff_layered_begin(mlff_model *model, int64_t n_all, int64_t n_local,
                               const double *positions, const int32_t *numbers);
mlff_status mlff_layered_forward(mlff_model *model, const double *ghosts, double *local_out);
mlff_status mlff_layered_energy(mlff_model *model, double *energy, double *atom_energies);
mlff_status mlff_layered_backward(mlff_model *model, const double *received, double *ghost_out);
mlff_status mlff_layered_forces(mlff_model *model, double *forces);

#ifdef __cplusplus
}
#endif

#endif /* MLFF_H */
