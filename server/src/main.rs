//! `strand`: the Strand server binary.
//!
//! Today it carries the operator tools that exist (`strand inspect`); the replica server itself
//! (`strand start`, `strand dev`) and the load harness (`strand bench`) arrive with their issues.

mod inspect;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Strand: a thread-per-core replica server for the Iggy binary protocol 0.11.0.
#[derive(Debug, Parser)]
#[command(name = "strand", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Decode wire bytes for operators.
    #[command(subcommand)]
    Inspect(inspect::Inspect),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Inspect(what) => inspect::run(what, &mut std::io::stdout().lock()),
    };
    match result {
        Ok(verdict) => verdict,
        Err(error) => {
            eprintln!("strand: {error:#}");
            ExitCode::from(2)
        }
    }
}
