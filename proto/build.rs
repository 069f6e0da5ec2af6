fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/sealion.proto");
    tonic_prost_build::configure()
        // Catalog messages are also the replicated state machine's types, and
        // travel inside Raft log entries and snapshots as JSON.
        .type_attribute(".", "#[derive(serde::Serialize, serde::Deserialize)]")
        .compile_protos(&["proto/sealion.proto"], &["proto"])?;
    Ok(())
}
