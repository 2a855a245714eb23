# syntax=docker/dockerfile:1
#
# The lockwarden image the Helm chart (charts/lockwarden) runs:
#   docker build -t ghcr.io/lockwarden/lockwarden:0.1.0 .
#
# Stage 1 builds the release binary with the pinned toolchain and the committed
# Cargo.lock (--locked); stage 2 is distroless (CA certificates, tzdata, no shell, no
# package manager) running as the unprivileged user 65532.
# The binary is static (glibc linked in, `+crt-static`, as scripts/static-binary builds
# it): the controller runs it here, but `lockwarden install DIR` also copies it into
# other containers, where `lockwarden guard` runs in the workload's own image (busybox,
# scratch, any distribution), whose C library it must not need.
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
# The target triple named explicitly: with --target, RUSTFLAGS reach the binary only,
# not the build scripts and proc-macros (which must stay dynamic to be loaded).
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    triple=$(rustc -vV | sed -n 's/^host: //p') \
 && RUSTFLAGS='-C target-feature=+crt-static' \
    cargo build --locked --release --target "$triple" --bin lockwarden \
 && install -D -m 0755 "target/$triple/release/lockwarden" /out/lockwarden

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
