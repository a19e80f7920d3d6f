//! Phase timing of calculator calls and MD steps: CUDA events on candle's stream on the GPU
//! (the device timeline of queued work), the host monotonic clock on the CPU.

#[cfg(feature = "cuda")]
use crate::error::Error;
use crate::error::Result;
use crate::phase::{Phase, PhaseClock};
use candle_core::Device;
use serde::{Deserialize, Serialize};
use std::time::Instant;

/// The phases of one call or step: start (µs since the clock started) and durations (µs).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Segment {
    pub start_us: f64,
    pub total_us: f64,
    pub phases: Vec<(Phase, f64)>,
}

enum Stamp {
    Host(Instant),
    #[cfg(feature = "cuda")]
    Event(candle_core::cuda_backend::cudarc::driver::CudaEvent),
}

/// Timestamps phase boundaries on a device.
pub struct DeviceClock {
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    device: Device,
    origin: Stamp,
    marks: Vec<(Phase, Stamp)>,
    /// The end stamp [`finish`](Self::finish) took, for the next cut.
    end: Option<Stamp>,
    /// Host time spent taking stamps since the last [`take_mark_time_us`](Self::take_mark_time_us).
    mark_time_us: f64,
}

impl DeviceClock {
    pub fn new(device: &Device) -> Result<Self> {
        let mut c = Self {
            device: device.clone(),
            origin: Stamp::Host(Instant::now()),
            marks: Vec::new(),
            end: None,
            mark_time_us: 0.0,
        };
        c.origin = c.stamp()?;
        Ok(c)
    }

    fn stamp(&self) -> Result<Stamp> {
        #[cfg(feature = "cuda")]
        if let Device::Cuda(c) = &self.device {
            use candle_core::cuda_backend::cudarc::driver::sys::CUevent_flags;
            let ev = c
                .cuda_stream()
                .record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
                .map_err(|e| Error::Device(format!("recording a CUDA event: {e}")))?;
            return Ok(Stamp::Event(ev));
        }
        Ok(Stamp::Host(Instant::now()))
    }

    /// Milliseconds from `a` to `b` (waits for the device to reach `b`).
    fn between(a: &Stamp, b: &Stamp) -> Result<f64> {
        match (a, b) {
            (Stamp::Host(a), Stamp::Host(b)) => Ok(b.duration_since(*a).as_secs_f64() * 1e3),
            #[cfg(feature = "cuda")]
            (Stamp::Event(a), Stamp::Event(b)) => a
                .elapsed_ms(b)
                .map(f64::from)
                .map_err(|e| Error::Device(format!("reading CUDA event times: {e}"))),
            #[cfg(feature = "cuda")]
            _ => Err(Error::Device("mixed host and CUDA clock stamps".into())),
        }
    }

    /// Host time spent in [`mark`](PhaseClock::mark) since the last call, µs.
    pub fn take_mark_time_us(&mut self) -> f64 {
        std::mem::take(&mut self.mark_time_us)
    }

    /// Stamps the end of the current phase and waits until the device has reached it (so that
    /// the following [`cut`](Self::cut) only reads times: waiting is the work's time, not the
    /// profiler's).
    pub fn finish(&mut self) -> Result<()> {
        let end = self.stamp()?;
        #[cfg(feature = "cuda")]
        if let Stamp::Event(e) = &end {
            e.synchronize()
                .map_err(|e| Error::Device(format!("waiting for a CUDA event: {e}")))?;
        }
        self.end = Some(end);
        Ok(())
    }

    /// Ends the current phase and returns the segment marked since the last cut. With
    /// `then = Some(p)`, phase `p` starts right away (MD: the integrator after a force call).
    pub fn cut(&mut self, then: Option<Phase>) -> Result<Segment> {
        let end = match self.end.take() {
            Some(e) => e,
            None => self.stamp()?,
        };
        let mut seg = Segment::default();
        if let Some((_, first)) = self.marks.first() {
            seg.start_us = 1e3 * Self::between(&self.origin, first)?;
            for (k, (phase, at)) in self.marks.iter().enumerate() {
                let next = self.marks.get(k + 1).map_or(&end, |m| &m.1);
                seg.phases.push((*phase, 1e3 * Self::between(at, next)?));
            }
            seg.total_us = seg.phases.iter().map(|p| p.1).sum();
        }
        self.marks.clear();
        if let Some(p) = then {
            self.marks.push((p, end));
        }
        Ok(seg)
    }
}

impl PhaseClock for DeviceClock {
    fn mark(&mut self, phase: Phase) -> Result<()> {
        let t = Instant::now();
        let s = self.stamp()?;
        self.marks.push((phase, s));
        self.mark_time_us += 1e6 * t.elapsed().as_secs_f64();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_clock_splits_a_call_into_its_phases() {
        let mut c = DeviceClock::new(&Device::Cpu).unwrap();
        c.mark(Phase::NeighborList).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        c.mark(Phase::Forward).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(5));
        let seg = c.cut(Some(Phase::Integrate)).unwrap();
        assert_eq!(seg.phases.len(), 2);
        assert!(
            seg.phases[0].1 >= 20_000.0 && seg.phases[1].1 >= 5_000.0,
            "{seg:?}"
        );
        assert!((seg.total_us - seg.phases[0].1 - seg.phases[1].1).abs() < 1e-9);
        // The next segment starts with the phase the cut opened.
        let next = c.cut(None).unwrap();
        assert_eq!(next.phases[0].0, Phase::Integrate);
        assert!(next.start_us >= seg.start_us + seg.total_us - 1.0);
        assert_eq!(c.cut(None).unwrap(), Segment::default());
    }
}
