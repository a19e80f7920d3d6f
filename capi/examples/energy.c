/* The C interface from C: the energy and forces of one water molecule with a student.
 *
 *   cc -std=c99 -I capi/include capi/examples/energy.c -L target/release -lmlff_capi \
 *      -Wl,-rpath,$PWD/target/release -o energy
 *   ./energy models/painn-gfn2.safetensors
 */
#include <stdio.h>

#include "mlff.h"

int main(int argc, char **argv)
{
  if (argc != 2) {
    fprintf(stderr, "usage: %s MODEL.safetensors\n", argv[0]);
    return 2;
  }
  mlff_model *model = NULL;
  if (mlff_model_load(argv[1], "cpu", 64, &model) != MLFF_OK) {
    fprintf(stderr, "error: %s\n", mlff_last_error());
    return 1;
  }
  const double x[9] = {0.0, 0.0, 0.0, 0.9572, 0.0, 0.0, -0.2400, 0.9266, 0.0};
  const int32_t z[3] = {8, 1, 1};
  double energy = 0.0, forces[9], atom_energies[3];
  /* A molecule: every atom local, no ghosts, no cell. */
  if (mlff_compute(model, 3, 3, x, z, NULL, NULL, &energy, atom_energies, forces, NULL) !=
      MLFF_OK) {
    fprintf(stderr, "error: %s\n", mlff_last_error());
    mlff_model_free(model);
    return 1;
  }
  printf("energy %.17g\n", energy);
  for (int i = 0; i < 3; i++)
    printf("atom %d energy %.17g force %.17g %.17g %.17g\n", i, atom_energies[i],
           forces[3 * i], forces[3 * i + 1], forces[3 * i + 2]);
  mlff_model_free(model);
  return 0;
}
