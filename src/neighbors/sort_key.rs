//! (neighbor, shift) packed into one integer, whose order is the tuples' order: a center's
//! edges are sorted as integers, much faster than as tuples.

/// Bit fields of a sort key: shift component k is stored as `s_k - lo[k]` in `bits[k]` bits,
/// below the neighbour index, so integer order is the lexicographic order of (neighbor, shift).
pub(super) struct Packing {
    pub lo: [i64; 3],
    pub bits: [u32; 3],
}

/// (neighbor, shift) packed into an integer: sorting integers is much faster than tuples.
pub(super) trait SortKey: Copy + Ord {
    fn pack(j: u32, s: [i32; 3], p: &Packing) -> Self;
    fn unpack(self, p: &Packing) -> (u32, [i32; 3]);
}

macro_rules! impl_sort_key {
    ($t:ty) => {
        impl SortKey for $t {
            #[inline]
            fn pack(j: u32, s: [i32; 3], p: &Packing) -> Self {
                let mut key = <$t>::from(j);
                for k in 0..3 {
                    key = (key << p.bits[k]) | (i64::from(s[k]) - p.lo[k]) as $t;
                }
                key
            }

            #[inline]
            fn unpack(self, p: &Packing) -> (u32, [i32; 3]) {
                let mut key = self;
                let mut s = [0i32; 3];
                for k in (0..3).rev() {
                    let mask: $t = (1 << p.bits[k]) - 1;
                    s[k] = ((key & mask) as i64 + p.lo[k]) as i32;
                    key >>= p.bits[k];
                }
                (key as u32, s)
            }
        }
    };
}
impl_sort_key!(u32);
impl_sort_key!(u64);
impl_sort_key!(u128);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sort_keys_round_trip_and_keep_tuple_order() {
        let narrow = Packing {
            lo: [-3, 0, -8],
            bits: [3, 0, 4],
        };
        let wide = Packing {
            lo: [i64::from(i32::MIN); 3],
            bits: [32; 3],
        };
        let mut t = vec![];
        for j in [0u32, 1, 7, u32::MAX] {
            for a in -3..=4 {
                for c in -8..=7 {
                    t.push((j, [a, 0, c]));
                }
            }
        }
        let mut by_key: Vec<u64> = t.iter().map(|&(j, s)| u64::pack(j, s, &narrow)).collect();
        let mut by_wide: Vec<u128> = t.iter().map(|&(j, s)| u128::pack(j, s, &wide)).collect();
        by_key.sort_unstable();
        by_wide.sort_unstable();
        t.sort_unstable();
        let back: Vec<_> = by_key.iter().map(|k| k.unpack(&narrow)).collect();
        let back_wide: Vec<_> = by_wide.iter().map(|k| k.unpack(&wide)).collect();
        assert_eq!(back, t);
        assert_eq!(back_wide, t);
        // 32-bit keys, while the indices leave room for the shifts.
        let small: Vec<_> = t.iter().copied().filter(|&(j, _)| j < 1 << 20).collect();
        let mut by_u32: Vec<u32> = small
            .iter()
            .map(|&(j, s)| u32::pack(j, s, &narrow))
            .collect();
        by_u32.sort_unstable();
        let back_u32: Vec<_> = by_u32.iter().map(|k| k.unpack(&narrow)).collect();
        assert_eq!(back_u32, small);
        let extreme = (u32::MAX, [i32::MIN, i32::MAX, -1]);
        assert_eq!(
            u128::pack(extreme.0, extreme.1, &wide).unpack(&wide),
            extreme
        );
    }
}
