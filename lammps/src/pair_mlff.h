/* pair_style mlff: an mlff-distiller PaiNN student as a LAMMPS pair style (a plugin over the
   C interface in ../../capi/include/mlff.h). */
#ifndef MLFF_PAIR_MLFF_H
#define MLFF_PAIR_MLFF_H

#include "pair.h"

#include <cstdint>
#include <string>
#include <vector>

struct mlff_model;

namespace LAMMPS_NS {

class PairMLFF : public Pair {
 public:
  PairMLFF(class LAMMPS *);
  ~PairMLFF() override;
  void compute(int, int) override;
  void settings(int, char **) override;
  void coeff(int, char **) override;
  void init_style() override;
  double init_one(int, int) override;
  double memory_usage() override;
  int pack_forward_comm(int, int *, double *, int, int *) override;
  void unpack_forward_comm(int, int, double *) override;
  int pack_reverse_comm(int, int, double *) override;
  void unpack_reverse_comm(int, int *, double *) override;

 private:
  mlff_model *model = nullptr;
  std::string model_path;
  std::string device = "cpu";
  int dtype_bits = 32;
  double receptive_field = 0.0;
  // exchange features: ghosts to one cutoff, each block's features exchanged between ranks
  // (mlff_layered_*); otherwise ghosts to the receptive field and one call (mlff_compute).
  bool layered = false;
  // Numbers per atom in a features exchange (mlff_layered_width).
  int width = 0;
  // Every atom's features (forward) or their gradients (reverse), [nall * width].
  std::vector<double> features;
  // Axes the engine treats as periodic (images from the cell, no ghost copies): periodic
  // axes that LAMMPS does not divide between ranks. Set in init_style.
  int cell_axes[3] = {0, 0, 0};
  // Whether ghosts are needed at all (some axis is divided between ranks).
  bool ghosts_needed = true;
  // The atoms the engine sees (locals first, then the ghosts it needs), chosen at each
  // neighbour-list build (when LAMMPS has just wrapped the atoms into the box).
  std::vector<int> seen;
  bigint seen_build = -1;
  int seen_nall = -1;
  std::vector<double> positions;
  // Atomic number of each LAMMPS type (index 0 unused).
  std::vector<int32_t> type_z;
  // Per-call buffers, grown to the number of local + ghost atoms.
  std::vector<int32_t> numbers;
  std::vector<double> forces, atom_energies;

  void allocate();
  void choose_atoms();
  int load_atoms();
  void add_forces();
  void compute_layered();
  void check(int status);
  std::string device_for_this_rank() const;
  [[noreturn]] void fail_all(const std::string &what);
};

}    // namespace LAMMPS_NS

#endif
