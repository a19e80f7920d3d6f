//! One axis of the cell list's grid: bin coordinates, the bins within reach of a point, and
//! the image an unwrapped bin stands for.

use super::Geometry;

/// One axis of the grid. Atoms get a bin coordinate `u = (s - off) · scale` (s fractional),
/// in [0, nb] up to rounding, and the bin `floor(u)` clamped to the grid. Along a periodic axis
/// an unwrapped bin `t` is bin `t mod nb` of image `floor(t / nb)`.
#[derive(Clone, Copy, Debug)]
pub(super) struct Axis {
    periodic: bool,
    pub nb: i64,
    off: f64,
    scale: f64,
    /// Perpendicular width of one bin, Å, and its inverse.
    bin_width: f64,
    per_width: f64,
}

impl Axis {
    pub fn new(g: &Geometry, k: usize, nb: usize, lo: f64, span: f64, reach: f64) -> Self {
        let d = g.widths[k];
        let nbf = nb as f64;
        let (off, scale, bin_width) = if g.periodic[k] {
            (0.0, nbf, d / nbf)
        } else if nb == 1 {
            // One bin holds every atom: any width does, the range is clamped to the bin.
            (0.0, 0.0, reach.max(1.0))
        } else {
            (lo, nbf / span, span * d / nbf)
        };
        Self {
            periodic: g.periodic[k],
            nb: nb as i64,
            off,
            scale,
            bin_width,
            per_width: 1.0 / bin_width,
        }
    }

    #[inline]
    pub fn coord(&self, s: f64) -> f64 {
        (s - self.off) * self.scale
    }

    #[inline]
    pub fn bin_of(&self, u: f64) -> usize {
        floor(u).clamp(0, self.nb - 1) as usize
    }

    /// Unwrapped bins that hold every atom within `h` Å (perpendicular) of coordinate `u`.
    #[inline]
    pub fn range(&self, u: f64, h: f64) -> (i64, i64) {
        let r = h * self.per_width;
        let (lo, hi) = (floor(u - r), floor(u + r));
        if self.periodic {
            (lo, hi)
        } else {
            (lo.clamp(0, self.nb - 1), hi.clamp(0, self.nb - 1))
        }
    }

    /// Bin and image of unwrapped bin `t`.
    #[inline]
    pub fn split(&self, t: i64) -> (i64, i64) {
        if (0..self.nb).contains(&t) {
            (t, 0)
        } else if self.periodic {
            (t.rem_euclid(self.nb), t.div_euclid(self.nb))
        } else {
            (t, 0)
        }
    }

    /// Perpendicular distance (Å) from coordinate `u` to unwrapped bin `t` (0 inside it).
    #[inline]
    pub fn gap(&self, u: f64, t: i64) -> f64 {
        let t = t as f64;
        let g = (t - u).max(u - (t + 1.0)).max(0.0);
        if g > 0.0 {
            g * self.bin_width
        } else {
            0.0
        }
    }

    /// Images the search can reach: every atom's coordinate lies in [0, nb].
    pub fn image_range(&self, reach: f64) -> (i64, i64) {
        if !self.periodic {
            return (0, 0);
        }
        let (lo, _) = self.range(0.0, reach);
        let (_, hi) = self.range(self.nb as f64, reach);
        ((lo - 1).div_euclid(self.nb), (hi + 1).div_euclid(self.nb))
    }
}

/// `floor(x)` as an integer, for finite `x` well inside the i64 range (saturating outside):
/// `f64::floor` is a library call on the baseline x86-64 target, and the search takes many.
#[inline]
fn floor(x: f64) -> i64 {
    let t = x as i64;
    t - i64::from((t as f64) > x)
}
