//! The C interface to mlff-distiller (`include/mlff.h` documents every function): load a
//! student onto a device, ask its cutoff, elements and receptive field, and compute one
//! domain's energies, forces and virial ([`mlff_distiller::domain`]), in one call with ghosts
//! out to the receptive field or block by block with ghosts out to one cutoff
//! (`mlff_layered_*`, [`LayeredDomain`]). What LAMMPS's `pair_style mlff` (../lammps) calls.
//!
//! Every entry point catches panics, so none unwinds into C; failures return a status and leave
//! their message in a thread-local buffer for `mlff_last_error`.

use mlff_distiller::device::{select, DeviceSpec};
use mlff_distiller::domain::{
    skin_for, DomainPrediction, DomainSession, LayeredDomain, LayeredSession,
};
use mlff_distiller::io::extxyz::atomic_number;
use mlff_distiller::model::Backend;
use mlff_distiller::{Error, PainnCalculator, Tuning};
use std::cell::RefCell;
use std::ffi::{c_char, c_int, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;

/// `mlff_status` of mlff.h.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    Ok = 0,
    Argument = 1,
    Model = 2,
    Input = 3,
    Device = 4,
    Compute = 5,
    Internal = 6,
}

/// A loaded model (opaque to C).
pub struct Model {
    calc: PainnCalculator,
    /// The neighbour list and device inputs kept between calls (an MD run's steps).
    session: DomainSession,
    /// The layered domains' list and device edges kept between calls.
    layered_session: LayeredSession,
    /// The layered domain of the call in progress (`mlff_layered_*`).
    layered: Option<LayeredDomain>,
}

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

fn set_error(msg: &str) {
    // An interior NUL cannot end up in C's string: it is cut there.
    let msg = msg.split('\0').next().unwrap_or_default();
    LAST_ERROR.with(|e| *e.borrow_mut() = CString::new(msg).unwrap_or_default());
}

/// A failure: its status and message.
struct Failure(Status, String);

impl Failure {
    fn argument(msg: impl Into<String>) -> Self {
        Self(Status::Argument, msg.into())
    }
}

/// The status a library error maps to.
fn status_of(e: &Error) -> Status {
    match e {
        Error::Checkpoint { .. } | Error::Io { .. } | Error::Config(_) => Status::Model,
        Error::UnknownElement { .. } | Error::Structure(_) | Error::NonFinite(_) => Status::Input,
        Error::Device(_) => Status::Device,
        _ => Status::Compute,
    }
}

impl From<Error> for Failure {
    fn from(e: Error) -> Self {
        Self(status_of(&e), e.to_string())
    }
}

/// Runs `f`, turning an error or a panic into a status and a message.
fn guarded(f: impl FnOnce() -> Result<(), Failure>) -> Status {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => {
            set_error("");
            Status::Ok
        }
        Ok(Err(Failure(status, msg))) => {
            set_error(&msg);
            status
        }
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            set_error(&format!("internal error (please report it): {what}"));
            Status::Internal
        }
    }
}

/// The model behind a handle.
///
/// # Safety
/// `model` is null or a live handle.
unsafe fn live<'a>(model: *const Model) -> Result<&'a Model, Failure> {
    model
        .as_ref()
        .ok_or_else(|| Failure::argument("model is null"))
}

/// The model behind a handle, to change.
///
/// # Safety
/// `model` is null or a live handle.
unsafe fn live_mut<'a>(model: *mut Model) -> Result<&'a mut Model, Failure> {
    model
        .as_mut()
        .ok_or_else(|| Failure::argument("model is null"))
}

/// `0 <= n_local <= n_all`, or an error naming both.
fn check_counts(n_all: i64, n_local: i64) -> Result<(), Failure> {
    if n_local < 0 || n_local > n_all {
        return Err(Failure::argument(format!(
            "n_all is {n_all} and n_local {n_local} (expected 0 <= n_local <= n_all)"
        )));
    }
    Ok(())
}

/// The string behind a C pointer, `what` naming the argument in errors.
///
/// # Safety
/// `p` is null or a NUL-terminated string.
unsafe fn c_str<'a>(p: *const c_char, what: &str) -> Result<&'a str, Failure> {
    if p.is_null() {
        return Err(Failure::argument(format!("{what} is null")));
    }
    CStr::from_ptr(p)
        .to_str()
        .map_err(|_| Failure::argument(format!("{what} is not UTF-8")))
}

#[no_mangle]
pub extern "C" fn mlff_last_error() -> *const c_char {
    LAST_ERROR.with(|e| e.borrow().as_ptr())
}

#[no_mangle]
pub extern "C" fn mlff_version() -> *const c_char {
    concat!(env!("CARGO_PKG_VERSION"), "\0").as_ptr().cast()
}

#[no_mangle]
pub extern "C" fn mlff_cuda_device_count() -> c_int {
    catch_unwind(mlff_distiller::device::cuda_device_count).map_or(0, |n| n as c_int)
}

/// # Safety
/// `symbol` is null or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn mlff_atomic_number(symbol: *const c_char) -> c_int {
    match c_str(symbol, "symbol") {
        Ok(s) => atomic_number(s).map_or(0, c_int::from),
        Err(_) => 0,
    }
}

/// # Safety
/// `path` and `device` are NUL-terminated strings; `out` points to writable storage.
#[no_mangle]
pub unsafe extern "C" fn mlff_model_load(
    path: *const c_char,
    device: *const c_char,
    dtype_bits: c_int,
    out: *mut *mut Model,
) -> Status {
    guarded(|| {
        if out.is_null() {
            return Err(Failure::argument("out is null"));
        }
        *out = std::ptr::null_mut();
        let path = c_str(path, "path")?;
        let spec: DeviceSpec = c_str(device, "device")?
            .parse()
            .map_err(|e: String| Failure(Status::Argument, e))?;
        let dtype = match dtype_bits {
            32 => candle_core::DType::F32,
            64 => candle_core::DType::F64,
            b => {
                return Err(Failure::argument(format!(
                    "dtype_bits is {b} (expected 32 or 64)"
                )))
            }
        };
        let device = select(spec)?.device;
        // The engine's tuning: defaults, then MLFF_TUNING=key=value,... for experiments.
        let tuning = Tuning::load(None).map_err(|e| Failure::argument(e.to_string()))?;
        // The fused kernels and their explicit adjoint: the fastest, and the leanest in memory
        // (a domain with its ghosts is several times the atoms it owns).
        let calc = PainnCalculator::from_checkpoint(Path::new(path), &device, dtype)?
            .with_tuning(tuning)
            .with_backend(Backend::Fused);
        calc.check_ops()?;
        let skin = skin_for(calc.tuning(), &device);
        let session = DomainSession::new(&calc, skin);
        let layered_session = LayeredSession::new(&calc, skin);
        *out = Box::into_raw(Box::new(Model {
            calc,
            session,
            layered_session,
            layered: None,
        }));
        Ok(())
    })
}

/// # Safety
/// `model` is null or a handle from `mlff_model_load` not freed yet.
#[no_mangle]
pub unsafe extern "C" fn mlff_model_free(model: *mut Model) {
    if !model.is_null() {
        drop(Box::from_raw(model));
    }
}

/// # Safety
/// `model` is a live handle (null gives NaN).
#[no_mangle]
pub unsafe extern "C" fn mlff_model_cutoff(model: *const Model) -> f64 {
    model
        .as_ref()
        .map_or(f64::NAN, |m| m.calc.model().config().cutoff)
}

/// # Safety
/// `model` is a live handle (null gives 0).
#[no_mangle]
pub unsafe extern "C" fn mlff_model_n_blocks(model: *const Model) -> c_int {
    model
        .as_ref()
        .map_or(0, |m| m.calc.model().config().n_blocks as c_int)
}

/// # Safety
/// `model` is a live handle (null gives NaN).
#[no_mangle]
pub unsafe extern "C" fn mlff_model_receptive_field(model: *const Model) -> f64 {
    model
        .as_ref()
        .map_or(f64::NAN, |m| m.calc.receptive_field())
}

/// # Safety
/// `model` is a live handle (null gives 0).
#[no_mangle]
pub unsafe extern "C" fn mlff_model_n_elements(model: *const Model) -> c_int {
    model
        .as_ref()
        .map_or(0, |m| m.calc.model().config().elements.len() as c_int)
}

/// # Safety
/// `model` is a live handle; `numbers` has room for `mlff_model_n_elements` values.
#[no_mangle]
pub unsafe extern "C" fn mlff_model_elements(model: *const Model, numbers: *mut i32) -> Status {
    guarded(|| {
        let m = live(model)?;
        if numbers.is_null() {
            return Err(Failure::argument("numbers is null"));
        }
        for (k, &z) in m.calc.model().config().elements.iter().enumerate() {
            *numbers.add(k) = i32::from(z);
        }
        Ok(())
    })
}

/// # Safety
/// As mlff.h says: `positions` holds `3 n_all` values, `numbers` `n_all`, `cell` 9 and `pbc` 3
/// (or null); the outputs that are not null have room for what they receive.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn mlff_compute(
    model: *mut Model,
    n_all: i64,
    n_local: i64,
    positions: *const f64,
    numbers: *const i32,
    cell: *const f64,
    pbc: *const i32,
    energy: *mut f64,
    atom_energies: *mut f64,
    forces: *mut f64,
    virial: *mut f64,
) -> Status {
    guarded(|| {
        let m = live_mut(model)?;
        check_counts(n_all, n_local)?;
        let lattice = match (cell.is_null(), pbc.is_null()) {
            (true, true) => None,
            (false, false) => {
                let c = std::slice::from_raw_parts(cell, 9);
                let p = std::slice::from_raw_parts(pbc, 3);
                let rows: [[f64; 3]; 3] =
                    std::array::from_fn(|r| [c[3 * r], c[3 * r + 1], c[3 * r + 2]]);
                Some((rows, [p[0] != 0, p[1] != 0, p[2] != 0]))
            }
            _ => return Err(Failure::argument("give both cell and pbc, or neither")),
        };
        let (zs, xyz) = atoms(n_all, positions, numbers)?;
        let got = match zs.is_empty() {
            true => DomainPrediction::empty(),
            false => {
                let cell = lattice.as_ref().map(|(c, p)| (c, *p));
                (m.session).compute(&m.calc, &zs, xyz, n_local as usize, cell)?
            }
        };
        write_out(&got, energy, atom_energies, forces, virial)
    })
}

/// The atomic numbers and positions of `n` atoms from C arrays.
///
/// # Safety
/// `positions` holds `3 n` values and `numbers` `n` (either may be null when `n` is 0).
unsafe fn atoms<'a>(
    n: i64,
    positions: *const f64,
    numbers: *const i32,
) -> Result<(Vec<u8>, &'a [[f64; 3]]), Failure> {
    let n = usize::try_from(n).map_err(|_| Failure::argument(format!("{n} atoms")))?;
    if n == 0 {
        return Ok((vec![], &[]));
    }
    if positions.is_null() || numbers.is_null() {
        return Err(Failure::argument("positions or numbers is null"));
    }
    // Rows of three doubles have the layout of [f64; 3]: read in place, not copied per step.
    let xyz = std::slice::from_raw_parts(positions.cast::<[f64; 3]>(), n);
    let zs = std::slice::from_raw_parts(numbers, n)
        .iter()
        .enumerate()
        .map(|(i, &z)| {
            u8::try_from(z).ok().filter(|&z| z >= 1).ok_or_else(|| {
                Failure(
                    Status::Input,
                    format!("atom {i} has atomic number {z} (expected 1 to 118)"),
                )
            })
        })
        .collect::<Result<Vec<u8>, Failure>>()?;
    Ok((zs, xyz))
}

/// Copies a result to the caller's buffers (the optional ones where not null).
///
/// # Safety
/// `energy` is writable; the others are null or have room for what they receive.
unsafe fn write_out(
    got: &DomainPrediction,
    energy: *mut f64,
    atom_energies: *mut f64,
    forces: *mut f64,
    virial: *mut f64,
) -> Result<(), Failure> {
    if energy.is_null() {
        return Err(Failure::argument("energy is null"));
    }
    *energy = got.energy;
    if !atom_energies.is_null() {
        std::slice::from_raw_parts_mut(atom_energies, got.atom_energies.len())
            .copy_from_slice(&got.atom_energies);
    }
    if !forces.is_null() {
        let out = std::slice::from_raw_parts_mut(forces, 3 * got.forces.len());
        for (row, f) in out.chunks_exact_mut(3).zip(&got.forces) {
            row.copy_from_slice(f);
        }
    }
    if !virial.is_null() {
        let out = std::slice::from_raw_parts_mut(virial, 9);
        for (k, w) in got.virial.iter().flatten().enumerate() {
            out[k] = *w;
        }
    }
    Ok(())
}

/// The error of a layered call before `mlff_layered_begin`.
fn no_layered() -> Failure {
    Failure::argument("no layered domain: call mlff_layered_begin first")
}

/// Copies `values` to the C buffer `out`, `what` naming it in errors.
///
/// # Safety
/// `out` is null or has room for `values.len()` values.
unsafe fn copy_to(values: &[f64], out: *mut f64, what: &str) -> Result<(), Failure> {
    if values.is_empty() {
        return Ok(());
    }
    if out.is_null() {
        return Err(Failure::argument(format!("{what} is null")));
    }
    std::slice::from_raw_parts_mut(out, values.len()).copy_from_slice(values);
    Ok(())
}

/// # Safety
/// `model` is a live handle (null gives 0).
#[no_mangle]
pub unsafe extern "C" fn mlff_layered_width(model: *const Model) -> c_int {
    model
        .as_ref()
        .map_or(0, |m| 4 * m.calc.model().config().hidden as c_int)
}

/// # Safety
/// As mlff.h says: `positions` holds `3 n_all` values and `numbers` `n_all`.
#[no_mangle]
pub unsafe extern "C" fn mlff_layered_begin(
    model: *mut Model,
    n_all: i64,
    n_local: i64,
    positions: *const f64,
    numbers: *const i32,
) -> Status {
    guarded(|| {
        let m = live_mut(model)?;
        m.layered = None;
        check_counts(n_all, n_local)?;
        let (zs, xyz) = atoms(n_all, positions, numbers)?;
        let domain = m
            .layered_session
            .domain(&m.calc, &zs, xyz, n_local as usize)?;
        m.layered = Some(domain);
        Ok(())
    })
}

/// # Safety
/// `ghosts` is null or holds n_ghost x width values; `local_out` has room for n_local x width.
#[no_mangle]
pub unsafe extern "C" fn mlff_layered_forward(
    model: *mut Model,
    ghosts: *const f64,
    local_out: *mut f64,
) -> Status {
    guarded(|| {
        let m = live_mut(model)?;
        let l = m.layered.as_mut().ok_or_else(no_layered)?;
        let n = l.n_ghost() * l.features_per_atom();
        let ghosts = (!ghosts.is_null()).then(|| std::slice::from_raw_parts(ghosts, n));
        let out = l.forward(&m.calc, ghosts)?;
        copy_to(&out, local_out, "local_out")
    })
}

/// # Safety
/// `energy` is writable; `atom_energies` is null or has room for n_local values.
#[no_mangle]
pub unsafe extern "C" fn mlff_layered_energy(
    model: *mut Model,
    energy: *mut f64,
    atom_energies: *mut f64,
) -> Status {
    guarded(|| {
        let m = live_mut(model)?;
        let e = m.layered.as_ref().ok_or_else(no_layered)?.atom_energies()?;
        if energy.is_null() {
            return Err(Failure::argument("energy is null"));
        }
        *energy = e.iter().sum();
        if !atom_energies.is_null() {
            copy_to(&e, atom_energies, "atom_energies")?;
        }
        Ok(())
    })
}

/// # Safety
/// `received` is null or holds n_local x width values; `ghost_out` has room for n_ghost x
/// width.
#[no_mangle]
pub unsafe extern "C" fn mlff_layered_backward(
    model: *mut Model,
    received: *const f64,
    ghost_out: *mut f64,
) -> Status {
    guarded(|| {
        let m = live_mut(model)?;
        let l = m.layered.as_mut().ok_or_else(no_layered)?;
        let n = l.n_local() * l.features_per_atom();
        let received = (!received.is_null()).then(|| std::slice::from_raw_parts(received, n));
        let out = l.backward(&m.calc, received)?;
        copy_to(&out, ghost_out, "ghost_out")
    })
}

/// # Safety
/// `forces` has room for 3 n_all values.
#[no_mangle]
pub unsafe extern "C" fn mlff_layered_forces(model: *mut Model, forces: *mut f64) -> Status {
    guarded(|| {
        let m = live_mut(model)?;
        let f = m.layered.as_ref().ok_or_else(no_layered)?.forces()?;
        copy_to(f.as_flattened(), forces, "forces")
    })
}
