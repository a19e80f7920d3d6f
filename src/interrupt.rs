//! SIGINT and SIGTERM as a request to stop. Long runs (`md`, `train`) poll a [`StopFlag`]
//! between steps, save what they have (restart, summary, checkpoint) and report
//! [`Error::Interrupted`](crate::Error::Interrupted); the CLI then exits with 128 + the signal
//! (130, 143), as a shell expects. A second signal ends the process at once.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

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

    /// The flag raised by SIGINT and SIGTERM, which from now on no longer end the process at
    /// once (a second one does, with status 128 + its number). The handlers are installed
    /// once per process (a handler the process had runs after ours, e.g. Python's, which
    /// raises KeyboardInterrupt once Python runs again); each call starts a run with the flag
    /// lowered.
    pub fn on_signals() -> std::io::Result<Self> {
        static HANDLERS: OnceLock<(StopFlag, Arc<AtomicBool>)> = OnceLock::new();
        let (flag, armed) = match HANDLERS.get() {
            Some(h) => h.clone(),
            None => {
                let h = (Self::new(), Arc::new(AtomicBool::new(false)));
                #[cfg(unix)]
                for sig in [SIGINT, SIGTERM] {
                    signal_hook::flag::register_conditional_shutdown(sig, 128 + sig, h.1.clone())?;
                    signal_hook::flag::register(sig, h.1.clone())?;
                    signal_hook::flag::register_usize(sig, h.0 .0.clone(), sig as usize)?;
                }
                HANDLERS.get_or_init(|| h).clone()
            }
        };
        flag.0.store(0, Ordering::SeqCst);
        armed.store(false, Ordering::SeqCst);
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
