use clap::Parser;

/// Distributed locks with fencing tokens in S3, DynamoDB, ZooKeeper and Kubernetes Leases.
#[derive(Parser)]
#[command(name = "lockwarden", version)]
struct Cli {}

fn main() {
    Cli::parse();
}
