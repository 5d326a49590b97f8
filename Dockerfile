# fedweave in a container: for `fedweave sweep GRID --emit k8s` and for
# anyone without a Rust toolchain.
#   docker build -t fedweave:latest .
#   docker run --rm -v "$PWD:/work" fedweave:latest run examples/quickstart.toml --out runs/q
# Stage 1 builds the release binary; stage 2 is a slim Debian image holding
# only the binary (the bundled datasets are compiled into it) and the
# examples.

FROM rust:1-slim-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked --bin fedweave

FROM debian:bookworm-slim
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /src/target/release/fedweave /usr/local/bin/fedweave
COPY examples /opt/fedweave/examples
WORKDIR /work
ENTRYPOINT ["fedweave"]
CMD ["--help"]
