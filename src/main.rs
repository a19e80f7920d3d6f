//! `mlff`: the mlff-distiller command line (the library's `cli` module, which the Python
//! package runs in process too).

fn main() -> std::process::ExitCode {
    match mlff_distiller::cli::run(std::env::args_os()) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
