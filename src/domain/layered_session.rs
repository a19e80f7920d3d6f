//! A layered domain's neighbour list and device edges kept between calls (an MD engine's
//! steps), as [`DomainSession`](super::DomainSession) keeps a whole domain's: a Verlet list
//! with a skin, rebuilt when an atom has moved more than half the skin or the atoms changed;
//! between builds a call uploads the positions alone. Pairs in the skin go through the model
//! as exact zeros (the cutoff function ends at the cutoff).

use super::layered::{DomainEdges, LayeredDomain};
use super::session::check_atoms;
use crate::error::Result;
use crate::neighbors::VerletList;
use crate::PainnCalculator;

/// The list and device edges of a run's layered domains.
pub struct LayeredSession {
    list: VerletList,
    /// The edges as last built, and the build they came from.
    edges: Option<(usize, DomainEdges)>,
}

impl LayeredSession {
    /// A session for `calc`'s cutoff with `skin` Å (0: the exact list at every call that moved
    /// an atom).
    pub fn new(calc: &PainnCalculator, skin: f64) -> Self {
        Self {
            list: VerletList::new(calc.model().config().cutoff, skin),
            edges: None,
        }
    }

    /// Number of neighbour-list builds so far.
    pub fn builds(&self) -> usize {
        self.list.rebuilds()
    }

    /// [`LayeredDomain::new`], reusing the list and the device edges while no atom has moved
    /// more than half the skin and the atoms, their count and the local ones are those of the
    /// last build.
    pub fn domain(
        &mut self,
        calc: &PainnCalculator,
        numbers: &[u8],
        positions: &[[f64; 3]],
        n_local: usize,
    ) -> Result<LayeredDomain> {
        check_atoms(numbers, positions, n_local)?;
        self.list.update(positions, None, [false; 3])?;
        let builds = self.list.rebuilds();
        let kept = (self.edges.take())
            .filter(|(b, e)| *b == builds && e.n_local == n_local && e.numbers == numbers);
        // (A failed build leaves no edges behind.)
        let edges = match kept {
            Some((_, edges)) => edges,
            None => DomainEdges::new(calc, numbers, n_local, self.list.list())?,
        };
        let domain = LayeredDomain::with_edges(calc, &edges, positions);
        self.edges = Some((builds, edges));
        domain
    }
}
