//! The `arbor` command line: the entry point and its exit codes. The commands
//! are in `cli/`.

use std::process::ExitCode;

use arbor::Error;
use arbor::config::ConfigError;
use clap::Parser;

/// mimalloc measured 2× faster than glibc's allocator on agent trees (BENCHMARKS.md).
#[cfg(feature = "mimalloc")]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// `println!` that returns the write's error instead of panicking: a reader
/// that closes the pipe (`arbor export T | head`) ends the command quietly
/// (see [`closed_pipe`]). Every line the CLI prints on stdout goes through it.
macro_rules! outln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        writeln!(std::io::stdout().lock(), $($arg)*).map_err($crate::StdoutError)
    }};
}

/// `print!` that returns the write's error (see [`outln!`]).
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let mut stdout = std::io::stdout().lock();
        write!(stdout, $($arg)*).and_then(|()| stdout.flush()).map_err($crate::StdoutError)
    }};
}

/// A failed write to stdout (its own type, so a broken pipe elsewhere, say
/// to a provider, is never taken for a closed stdout).
#[derive(Debug, thiserror::Error)]
#[error("cannot write to stdout: {0}")]
struct StdoutError(#[source] std::io::Error);

// After the macros: the commands print with them.
mod cli;
mod idle;

use cli::{Cli, Command, colour, log_filter};

/// Whether `error` comes from writing to a pipe whose reader has gone.
fn closed_pipe(error: &anyhow::Error) -> bool {
    error.chain().any(|e| {
        e.downcast_ref::<StdoutError>()
            .is_some_and(|e| e.0.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

/// The exit code of a command whose stdout reader went away: what a shell
/// reports for a process ended by SIGPIPE (128 + 13), as `yes | head` does.
const CLOSED_PIPE_EXIT: u8 = 141;

fn main() -> ExitCode {
    // However `main` ends (a return, a panic unwinding out of it), no MCP
    // server or command-tool process is left behind.
    let _reaper = arbor::tools::reaper::ExitGuard;
    let cli = Cli::parse();
    // A service, a run and a resume set up their own logs once their config
    // is read (serve(), run::command_logs: spans to a collector too).
    if !matches!(
        cli.command,
        Command::Serve { .. } | Command::Run(_) | Command::Resume { .. }
    ) {
        tracing_subscriber::fmt()
            .with_env_filter(log_filter("warn"))
            .with_writer(std::io::stderr)
            .with_ansi(colour(&std::io::stderr()))
            .init();
    }
    match cli::dispatch(cli) {
        Ok(code) => code,
        // Nothing to say: whoever reads stdout has all it wanted.
        Err(error) if closed_pipe(&error) => ExitCode::from(CLOSED_PIPE_EXIT),
        Err(error) => {
            if let Some(config) = config_error(&error) {
                eprintln!("error: invalid config\n{config}");
                return ExitCode::from(2);
            }
            // A request the supervisor refused, as it would from the library
            // or HTTP; the command line's own flags are named as typed.
            if let Some((field, problem)) = invalid_request(&error) {
                let field = match field {
                    "tools.allow" => "--allow-tools",
                    "tools.deny" => "--deny-tools",
                    "model" => "--model",
                    field => field,
                };
                eprintln!("error: {field}: {problem}");
                return ExitCode::from(2);
            }
            eprintln!("error: {error:#}");
            ExitCode::from(1)
        }
    }
}

fn invalid_request(error: &anyhow::Error) -> Option<(&str, &str)> {
    error.chain().find_map(|e| {
        let supervisor = e.downcast_ref::<arbor_supervisor::Error>().or_else(|| {
            match e.downcast_ref::<Error>() {
                Some(Error::Supervisor(s)) => Some(s),
                _ => None,
            }
        });
        match supervisor {
            Some(arbor_supervisor::Error::InvalidRequest { field, problem }) => {
                Some((field.as_str(), problem.as_str()))
            }
            _ => None,
        }
    })
}

fn config_error(error: &anyhow::Error) -> Option<&ConfigError> {
    error.chain().find_map(|e| {
        e.downcast_ref::<ConfigError>()
            .or_else(|| match e.downcast_ref::<Error>() {
                Some(Error::Config(c)) => Some(c),
                _ => None,
            })
    })
}
