//! `mlff`: the mlff-distiller command line.

mod cli;

fn main() -> std::process::ExitCode {
    match cli::run() {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
