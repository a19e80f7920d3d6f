//! SIGINT and SIGTERM as a request to stop. Long runs (`md`, `train`) poll a [`StopFlag`]
//! between steps, save what they have (restart, summary, checkpoint) and report
//! [`Error::Interrupted`](crate::Error::Interrupted); the CLI then exits with 128 + the signal
//! (130, 143), as a shell expects. A second signal ends the process at once.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

pub const SIGINT: i32 = 2;
pub const SIGTERM: i32 = 15;

/// Raised (with the signal's number) when a stop was asked for.
#[derive(Clone, Debug, Default)]
pub struct StopFlag(Arc<AtomicUsize>);

impl StopFlag {
    /// A flag nothing raises but [`raise`](Self::raise) (library users, tests).
    pub fn new() -> Self {
        Self::default()
    }

    /// A flag raised by SIGINT and SIGTERM, which from now on no longer end the process at
    /// once (a second one does, with status 128 + its number).
    pub fn on_signals() -> std::io::Result<Self> {
        let flag = Self::new();
        #[cfg(unix)]
        {
            let armed = Arc::new(AtomicBool::new(false));
            for sig in [SIGINT, SIGTERM] {
                signal_hook::flag::register_conditional_shutdown(sig, 128 + sig, armed.clone())?;
                signal_hook::flag::register(sig, armed.clone())?;
                signal_hook::flag::register_usize(sig, flag.0.clone(), sig as usize)?;
            }
        }
        Ok(flag)
    }

    /// Asks for a stop as `signal` would.
    pub fn raise(&self, signal: i32) {
        self.0.store(signal as usize, Ordering::SeqCst);
    }

    /// The signal that asked for a stop, if one did.
    pub fn raised(&self) -> Option<i32> {
        match self.0.load(Ordering::Relaxed) {
            0 => None,
            s => Some(s as i32),
        }
    }
}
