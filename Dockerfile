# syntax=docker/dockerfile:1
#
# The lockwarden image the Helm chart (charts/lockwarden) runs:
#   docker build -t ghcr.io/lockwarden/lockwarden:0.1.0 .
#
# Stage 1 builds the release binary with the pinned toolchain and the committed
# Cargo.lock (--locked); stage 2 is distroless (glibc, CA certificates, tzdata, no
# shell, no package manager) running as the unprivileged user 65532.
# The builder and the runtime are both Debian 12 (bookworm), so the binary's glibc
# matches the runtime's.
#
# Two build arguments exist for the test suite (scripts/testenv), which has no registry
# to pull from: BINARY_STAGE=prebuilt takes the binary from the build context
# (PREBUILT_BINARY) instead of compiling it, and RUNTIME_BASE names a local base image
# with distroless's content, assembled from the same Debian 12 packages. The runtime
# stage is the same either way. Their defaults are the build above.

ARG RUST_VERSION=1.95
ARG RUNTIME_BASE=gcr.io/distroless/cc-debian12:nonroot
ARG BINARY_STAGE=build

FROM docker.io/library/rust:${RUST_VERSION}-bookworm AS build
WORKDIR /src
# aws-lc-sys (TLS for the AWS SDK and the Kubernetes client) compiles C with the
# image's gcc; nothing else is needed from the system.
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --locked --release --bin lockwarden \
 && install -D -m 0755 target/release/lockwarden /out/lockwarden

# A binary built outside this file (BINARY_STAGE=prebuilt); BuildKit skips this stage
# unless it is selected.
FROM scratch AS prebuilt
ARG PREBUILT_BINARY=lockwarden
COPY ${PREBUILT_BINARY} /out/lockwarden

FROM ${BINARY_STAGE} AS binary

FROM ${RUNTIME_BASE}
COPY --from=binary /out/lockwarden /usr/local/bin/lockwarden
# distroless's "nonroot" user; numeric so runAsNonRoot can verify it.
USER 65532:65532
# /metrics, /healthz, /readyz (--metrics-address).
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/lockwarden", "controller"]
