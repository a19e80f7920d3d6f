// A training step's batch gathered from the frames held on the device, inside the captured
// step: the step's only upload is a table of which frames it takes (src/train/resident.rs).
// The output is the padded batch exactly as the host assembles it (src/train/fused_step.rs,
// `step_inputs`), every value in f64, integers included (the caller casts them to u32):
//   labels   [Ê (S) | 1/n (S) | F̂ (3N) | mask (N) | 1/B, 1/3n]
//   geometry [positions (3N) | image offsets (3C)]
//   indices  [species (N) | structure (N) | centers (C) | neighbors (C)]
// Mirrors src/ops/frames.rs, whose CPU twin writes the same values.
#include <cstddef>

// The last k in [0, b) with start[k] <= i (start ascending from 0): the structure holding row
// i. Structures without rows (no edges) share their start with the next, which owns it.
__device__ inline unsigned owner(const unsigned* start, unsigned b, size_t i) {
    unsigned lo = 0, hi = b;
    while (hi - lo > 1) {
        const unsigned mid = lo + (hi - lo) / 2;
        if (start[mid] <= i) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    return lo;
}

// table = [b, structures B and atoms n the loss averages over, frame (S),
//          atom start (S + 1), edge start (S + 1)]; rows of structures k >= b are padding.
// The frames: positions, forces [A, 3], energies [F], offsets [E, 3]; atom and edge begins
// [F + 1], species [A], centers and neighbors [E] numbered within their frame.
extern "C" __global__ void gather_frames_f64(
    const double* positions, const double* forces, const double* energy, const double* offsets,
    const unsigned* table, const unsigned* atom_begin, const unsigned* edge_begin,
    const unsigned* species, const unsigned* centers, const unsigned* neighbors, double* out,
    size_t S, size_t N, size_t C, double far) {
    const unsigned b = table[0];
    const unsigned* frame = table + 3;
    const unsigned* atom_start = frame + S;
    const unsigned* edge_start = atom_start + S + 1;
    const size_t n = atom_start[b], e = edge_start[b];
    double* energy_out = out;
    double* inv_atoms = out + S;
    double* forces_out = out + 2 * S;
    double* mask = forces_out + 3 * N;
    double* norms = mask + N;
    double* pos_out = norms + 2;
    double* offsets_out = pos_out + 3 * N;
    double* species_out = offsets_out + 3 * C;
    double* structure_out = species_out + N;
    double* centers_out = structure_out + N;
    double* neighbors_out = centers_out + C;
    const size_t work = S + N + C;
    for (size_t t = blockIdx.x * (size_t)blockDim.x + threadIdx.x; t < work;
         t += (size_t)gridDim.x * blockDim.x) {
        if (t < S) {
            const size_t s = t;
            if (s < b) {
                const unsigned f = frame[s];
                const unsigned atoms = atom_begin[f + 1] - atom_begin[f];
                energy_out[s] = energy[f];
                inv_atoms[s] = 1.0 / (double)(atoms > 1 ? atoms : 1);
            } else {
                energy_out[s] = 0.0;
                inv_atoms[s] = 0.0;
            }
            if (s == 0) {
                const double B = table[1], three_n = 3.0 * (double)table[2];
                norms[0] = 1.0 / (B > 1.0 ? B : 1.0);
                norms[1] = 1.0 / (three_n > 1.0 ? three_n : 1.0);
            }
        } else if (t < S + N) {
            const size_t i = t - S;
            if (i < n) {
                const unsigned k = owner(atom_start, b, i);
                const size_t g = atom_begin[frame[k]] + (i - atom_start[k]);
                for (int c = 0; c < 3; ++c) {
                    pos_out[3 * i + c] = positions[3 * g + c];
                    forces_out[3 * i + c] = forces[3 * g + c];
                }
                mask[i] = 1.0;
                species_out[i] = species[g];
                structure_out[i] = k;
            } else {
                // Padding atoms: isolated, far apart, in structure b.
                pos_out[3 * i] = 1e4 + far * (double)(i - n);
                pos_out[3 * i + 1] = 0.0;
                pos_out[3 * i + 2] = 0.0;
                for (int c = 0; c < 3; ++c) forces_out[3 * i + c] = 0.0;
                mask[i] = 0.0;
                species_out[i] = 0.0;
                structure_out[i] = b;
            }
        } else {
            const size_t j = t - S - N;
            if (j < e) {
                const unsigned k = owner(edge_start, b, j);
                const size_t g = edge_begin[frame[k]] + (j - edge_start[k]);
                centers_out[j] = centers[g] + atom_start[k];
                neighbors_out[j] = neighbors[g] + atom_start[k];
                for (int c = 0; c < 3; ++c) offsets_out[3 * j + c] = offsets[3 * g + c];
            } else {
                // Padding edges: beyond the cutoff (graph::pad_edges).
                const size_t q = (j - e) % N;
                centers_out[j] = q;
                neighbors_out[j] = q;
                offsets_out[3 * j] = far;
                offsets_out[3 * j + 1] = 0.0;
                offsets_out[3 * j + 2] = 0.0;
            }
        }
    }
}
