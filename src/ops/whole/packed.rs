//! The model's sizes and the layout of the packed weights the one-launch kernels read
//! (kernels/include/packed_weights.cuh): one buffer, block by block.

/// The model sizes packed weights describe (layout: [`ModelShape::packed_len`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ModelShape {
    pub hidden: usize,
    pub n_rbf: usize,
    pub blocks: usize,
    pub elements: usize,
    pub cutoff: f64,
}

/// Offsets within one block's packed weights (BlockWeights in the .cu file): matrices are
/// input-major [in, out].
pub(crate) struct BlockOffsets {
    pub(crate) filter: usize,
    pub(crate) w1: usize,
    pub(crate) b1: usize,
    pub(crate) w2: usize,
    pub(crate) b2: usize,
    pub(crate) mix: usize,
    pub(crate) c1: usize,
    pub(crate) cb1: usize,
    pub(crate) c2: usize,
    pub(crate) cb2: usize,
    pub(crate) len: usize,
}

impl BlockOffsets {
    fn new(f: usize, r: usize) -> Self {
        let filter = 0;
        let w1 = filter + (r + 1) * 3 * f;
        let b1 = w1 + f * f;
        let w2 = b1 + f;
        let b2 = w2 + 3 * f * f;
        let mix = b2 + 3 * f;
        let c1 = mix + 2 * f * f;
        let cb1 = c1 + 2 * f * f;
        let c2 = cb1 + f;
        let cb2 = c2 + 3 * f * f;
        Self {
            filter,
            w1,
            b1,
            w2,
            b2,
            mix,
            c1,
            cb1,
            c2,
            cb2,
            len: cb2 + 3 * f,
        }
    }
}

impl ModelShape {
    /// Packed order: embedding [elements, F], per-element energy constants \[elements\], readout
    /// hidden layer [F, F/2] and bias [F/2], readout output weights times the scale [F/2], then
    /// per block: filter [R + 1, 3F] (bias last), φ [F, F] + \[F\], [F, 3F] + \[3F\], W_mix
    /// [F, 2F], context [2F, F] + \[F\], [F, 3F] + \[3F\]; last the first block's φ of each
    /// element [elements, 3F] (its input is the embedding, so it depends on the element alone).
    pub fn packed_len(&self) -> usize {
        let (f, h2) = (self.hidden, self.hidden / 2);
        self.elements * (f + 1)
            + f * h2
            + 2 * h2
            + self.blocks * self.block().len
            + self.elements * 3 * f
    }

    pub(crate) fn block(&self) -> BlockOffsets {
        BlockOffsets::new(self.hidden, self.n_rbf)
    }
}
