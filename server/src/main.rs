fn main() {
    eprintln!("strand: no subcommands yet");
    std::process::exit(2);
}
