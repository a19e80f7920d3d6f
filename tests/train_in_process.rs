//! `mlff train` called in process, as `mlff distill` calls it: a training with a stress term
//! after one without, on the same thread. Candle decides once per thread whether a backward
//! pass keeps its graph (CANDLE_GRAD_DO_NOT_DETACH); the stress term needs it kept. Its own
//! test binary, so that no other test sets the variable first.

mod common;

use std::path::Path;
use std::process::ExitCode;

fn train(data: &Path, config: &Path, out: &Path, extra: &[&str]) -> ExitCode {
    let mut args = vec!["mlff", "train", "--train", common::s(data), "--val"];
    args.extend([common::s(data), "--config", common::s(config)]);
    args.extend(["--epochs", "1", "--batch-size", "3", "--device", "cpu"]);
    args.extend(["--out", common::s(out)]);
    args.extend_from_slice(extra);
    mlff_distiller::cli::run(args).unwrap()
}

#[test]
fn a_stress_term_trains_after_a_first_order_training_on_the_same_thread() {
    let dir = tempfile::tempdir().unwrap();
    let (config, data) = common::stress_boxes(dir.path(), 70);

    // A first-order backward through candle's autograd on this thread, without the variable.
    let first = dir.path().join("first");
    let code = train(&data, &config, &first, &["--force-gradient", "directional"]);
    assert_eq!(code, ExitCode::SUCCESS);

    let second = dir.path().join("second");
    let code = train(&data, &config, &second, &["--stress-weight", "1e4"]);
    assert_eq!(code, ExitCode::SUCCESS);
    let log = std::fs::read_to_string(second.join("log.jsonl")).unwrap();
    let last: serde_json::Value = serde_json::from_str(log.lines().last().unwrap()).unwrap();
    assert!(last["val_stress_mae"].as_f64().unwrap() > 0.0, "{last}");
}
