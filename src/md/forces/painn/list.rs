//! The Verlet list of [`PainnForces`]: built on the host or the device, wrapped into the
//! cells, and the displacement test that decides when to build it again.

use super::{ListSource, ListTensors, PainnForces};
use crate::error::{Error, Result};
use crate::graph::fitted_list;
use crate::md::positions::{
    device_positions, displacement2, host_positions, largest_displacement2, non_finite_atom,
};
use crate::neighbors::{image_offset, neighbor_list, wrap_positions, NeighborList};
use crate::structure::Structure;
use candle_core::Tensor;

impl PainnForces<'_> {
    /// Builds the list at `host` (positions as given, not wrapped again) and uploads it.
    pub(super) fn build(&mut self, host: &[[f64; 3]]) -> Result<()> {
        if self.device_list.is_some() {
            let positions = device_positions(host, self.calculator.device())?;
            return self.build_on_device(&positions, false).map(drop);
        }
        let mut lists = Vec::with_capacity(self.systems.len());
        let mut host_offsets = Vec::new();
        for (k, s) in self.systems.iter().enumerate() {
            let at = &host[self.starts[k]..self.starts[k + 1]];
            let nl = neighbor_list(at, s.cell.as_ref(), s.pbc, self.cutoff + self.skin).map_err(
                |e| match e {
                    Error::NeighborList(m) if self.systems.len() > 1 => {
                        Error::NeighborList(format!("system {k}: {m}"))
                    }
                    other => other,
                },
            )?;
            host_offsets.extend(
                nl.shifts
                    .iter()
                    .map(|&sh| image_offset(sh, s.cell.as_ref())),
            );
            lists.push(nl);
        }
        self.host_list = NeighborList::concat(lists.iter(), &self.starts);
        self.host_builds += 1;
        let nl = &self.host_list;
        let dev = self.calculator.device();
        let e = nl.len();
        let offsets = host_offsets.iter().flatten().copied().collect();
        self.edges = Some(ListTensors {
            centers: Tensor::from_vec(nl.centers.clone(), e, dev)?,
            neighbors: Tensor::from_vec(nl.neighbors.clone(), e, dev)?,
            offsets: Tensor::from_vec(offsets, (e, 3), dev)?.to_dtype(self.calculator.dtype())?,
            source: ListSource::Host(host_offsets),
        });
        let reference = device_positions(host, dev)?;
        self.built(reference)
    }

    /// Builds the list on the device at `positions` ([N, 3] f64), wrapped into the cell first
    /// when `wrap`; returns the positions the list refers to. Nothing goes to the host but the
    /// edge count (and, where it is not finite, the atom at fault).
    pub(super) fn build_on_device(&mut self, positions: &Tensor, wrap: bool) -> Result<Tensor> {
        let Some(builder) = &self.device_list else {
            return Err(Error::Md("no device neighbour list".into()));
        };
        let x = if wrap {
            builder.wrap(positions)?
        } else {
            positions.clone()
        };
        if !x.sum_all()?.to_scalar::<f64>()?.is_finite() {
            return Err(non_finite_atom(&x));
        }
        // The graph's capacity while the list fits it, so that its slots are copied as they
        // are; a list that overflows is built again with room to grow.
        let capacity = self
            .graph
            .as_ref()
            .map_or(self.list_capacity, |g| g.shape().edge_capacity);
        let (dtype, spans) = (self.calculator.dtype(), self.spans.as_ref());
        let (list, edges, capacity) = fitted_list(x.dim(0)?, capacity, |c| {
            builder.build_systems(&x, spans, c, dtype)
        })?;
        self.list_capacity = capacity;
        self.device_builds += 1;
        let (centers, neighbors, offsets) = list.narrow(edges)?;
        self.edges = Some(ListTensors {
            centers,
            neighbors,
            offsets,
            source: ListSource::Device(list),
        });
        self.built(x.clone())?;
        Ok(x)
    }

    /// After a build: the graph gets the new list, and the displacement check its reference.
    pub(super) fn built(&mut self, reference: Tensor) -> Result<()> {
        if self.list_cells.is_some() {
            self.list_cells = Some(self.cells());
        }
        if self.graph_max_edges > 0 {
            self.update_graph(&reference)?;
        }
        if let Some(steps) = &mut self.steps {
            steps.set_reference(&reference)?;
        }
        self.reference = Some(reference);
        Ok(())
    }

    /// Builds the list at `positions`, wrapping them into the cells.
    pub(super) fn rebuild_at(&mut self, positions: &mut Tensor) -> Result<()> {
        if self.device_list.is_some() {
            let wrapped = self.build_on_device(positions, true)?;
            *positions = wrapped;
            return Ok(());
        }
        let mut host = host_positions(positions)?;
        for (k, s) in self.systems.iter().enumerate() {
            let at = &mut host[self.starts[k]..self.starts[k + 1]];
            wrap_positions(at, s.cell.as_ref(), s.pbc)?;
        }
        self.build(&host)?;
        if self.systems.iter().any(Structure::is_periodic) {
            *positions = device_positions(&host, self.calculator.device())?;
        }
        Ok(())
    }

    /// Largest squared displacement since the last build (NaN when a position is not finite).
    pub(super) fn max_displacement2(&self, positions: &Tensor, reference: &Tensor) -> Result<f64> {
        let both = displacement2(positions, reference)?.to_vec1::<f64>()?;
        Ok(largest_displacement2(&both))
    }

    /// Largest squared displacement since the build that the list allows: (skin / 2)².
    pub(super) fn list_limit2(&self) -> f64 {
        let half = 0.5 * self.skin;
        half * half
    }
}
