//! Element symbols and atomic numbers, as ASE spells them.

use std::sync::OnceLock;

/// Element symbols by atomic number: `ELEMENTS[z - 1]`.
pub const ELEMENTS: [&str; 118] = [
    "H", "He", "Li", "Be", "B", "C", "N", "O", "F", "Ne", "Na", "Mg", "Al", "Si", "P", "S", "Cl",
    "Ar", "K", "Ca", "Sc", "Ti", "V", "Cr", "Mn", "Fe", "Co", "Ni", "Cu", "Zn", "Ga", "Ge", "As",
    "Se", "Br", "Kr", "Rb", "Sr", "Y", "Zr", "Nb", "Mo", "Tc", "Ru", "Rh", "Pd", "Ag", "Cd", "In",
    "Sn", "Sb", "Te", "I", "Xe", "Cs", "Ba", "La", "Ce", "Pr", "Nd", "Pm", "Sm", "Eu", "Gd", "Tb",
    "Dy", "Ho", "Er", "Tm", "Yb", "Lu", "Hf", "Ta", "W", "Re", "Os", "Ir", "Pt", "Au", "Hg", "Tl",
    "Pb", "Bi", "Po", "At", "Rn", "Fr", "Ra", "Ac", "Th", "Pa", "U", "Np", "Pu", "Am", "Cm", "Bk",
    "Cf", "Es", "Fm", "Md", "No", "Lr", "Rf", "Db", "Sg", "Bh", "Hs", "Mt", "Ds", "Rg", "Cn", "Nh",
    "Fl", "Mc", "Lv", "Ts", "Og",
];

/// The symbol of atomic number `z` (1..=118).
pub fn symbol(z: u8) -> Option<&'static str> {
    ELEMENTS.get(usize::from(z).checked_sub(1)?).copied()
}

/// Table index of a one- or two-letter ASCII symbol, ignoring case.
fn symbol_key(s: &[u8]) -> Option<usize> {
    let letter = |b: u8| {
        let l = b.to_ascii_lowercase();
        l.is_ascii_lowercase().then(|| usize::from(l - b'a'))
    };
    match *s {
        [a] => Some(letter(a)? * 27),
        [a, b] => Some(letter(a)? * 27 + letter(b)? + 1),
        _ => None,
    }
}

/// The atomic number of an element symbol. Case is ignored, as ASE capitalises symbols
/// (`si` and `SI` are silicon).
pub fn atomic_number(sym: &str) -> Option<u8> {
    static TABLE: OnceLock<[u8; 26 * 27]> = OnceLock::new();
    let table = TABLE.get_or_init(|| {
        let mut t = [0u8; 26 * 27];
        for (i, s) in ELEMENTS.iter().enumerate() {
            if let Some(k) = symbol_key(s.as_bytes()) {
                t[k] = (i + 1) as u8;
            }
        }
        t
    });
    let z = table[symbol_key(sym.as_bytes())?];
    (z != 0).then_some(z)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn element_table() {
        assert_eq!(ELEMENTS.len(), 118);
        for (i, s) in ELEMENTS.iter().enumerate() {
            assert_eq!(atomic_number(s), Some(i as u8 + 1), "{s}");
            assert_eq!(symbol(i as u8 + 1), Some(*s));
        }
        assert_eq!(atomic_number("si"), Some(14));
        assert_eq!(atomic_number("SI"), Some(14));
        for bad in ["", "X", "Xx", "Abc", "1", "é", "Q"] {
            assert_eq!(atomic_number(bad), None, "{bad}");
        }
        assert_eq!(symbol(0), None);
        assert_eq!(symbol(119), None);
    }
}
