//! Generates the CSI v1 and kubelet plugin-registration messages and
//! services from `proto/` with a pure-Rust protobuf compiler (no protoc).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = [
        "proto/csi-v1.3.0.proto",
        "proto/pluginregistration-v1.proto",
    ];
    for file in files {
        println!("cargo:rerun-if-changed={file}");
    }
    let descriptors = protox::compile(files, ["proto"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(descriptors)?;
    Ok(())
}
