//! `hub-job-relay job-relay --socket PATH NAME`: the relay pi starts for each server
//! ([`hub::pi_relay`]), as `pi-dispatch job-relay` is in the product.

fn main() -> std::process::ExitCode {
    let args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    match args.split_first() {
        Some((first, rest)) if first == "job-relay" => hub::pi_relay::main(rest),
        _ => {
            eprintln!("usage: hub-job-relay job-relay --socket PATH NAME");
            std::process::ExitCode::from(2)
        }
    }
}
