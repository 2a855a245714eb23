//! Logging to stderr, for the command-line tool and the controller alike.

use super::args::{GlobalArgs, LogFormat};

/// Sets up logging to stderr. Quiet by default: a command's own messages say what
/// happened, and stray log lines would break its one-line errors.
pub fn init_logging(global: &GlobalArgs) {
    let default = match global.verbose {
        0 => "off",
        1 => "lockwarden=info",
        2 => "lockwarden=debug",
        _ => "debug",
    };
    let filter = std::env::var("LOCKWARDEN_LOG")
        .ok()
        .and_then(|f| tracing_subscriber::EnvFilter::try_new(f).ok())
        .unwrap_or_else(|| tracing_subscriber::EnvFilter::new(default));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false);
    let _ = match global.log_format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}
