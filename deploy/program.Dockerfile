# An image of your own program on cohort (a crate that depends on cohort, as
# examples/template does), for the manifests in deploy/: the same runtime layout as cohort's own
# image (deploy/Dockerfile), your binary in place of `cohort`.
#
# Build from your crate's root (its Cargo.toml and Cargo.lock; cohort as a git or registry
# dependency, since a path outside the build context cannot be copied in):
#   docker build -f program.Dockerfile --build-arg BIN=my-trainer -t my-trainer:1 .
# and in the manifests set `image:` to it and `command: ["/usr/local/bin/program"]` with your
# program's own arguments (a cohort program reads its task from TF_CONFIG or COHORT_* as
# `cohort role` does; `cohort::program::main` serves every role).
#
# Dependencies are built in a layer of their own, from the manifests alone: editing your
# sources rebuilds your crate only. (The registry is a BuildKit cache mount as well.)

ARG RUST_IMAGE=rust:1.95-slim-bookworm

# ---- dependencies: your Cargo.toml and Cargo.lock, with an empty program ----
FROM ${RUST_IMAGE} AS deps
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    mkdir src && echo 'fn main() {}' > src/main.rs \
    && cargo build --release --locked \
    && rm -rf src

# ---- your program, over the dependencies already built ----
FROM deps AS builder
ARG BIN
COPY src ./src
# A source newer than the empty program's build, so that cargo rebuilds your crate.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    test -n "${BIN}" \
    && touch src/main.rs \
    && cargo build --release --locked --bin "${BIN}" \
    && install -D "target/release/${BIN}" /out/program

# ---- runtime: the binary, its user, nothing else ----
FROM debian:bookworm-slim
RUN groupadd --system --gid 10001 cohort \
    && useradd --system --uid 10001 --gid cohort --no-create-home \
       --home-dir /var/lib/cohort --shell /usr/sbin/nologin cohort \
    && mkdir -p /var/lib/cohort \
    && chown cohort:cohort /var/lib/cohort
COPY --from=builder /out/program /usr/local/bin/program
USER 10001:10001
WORKDIR /var/lib/cohort
EXPOSE 2222/udp 9100/tcp
ENTRYPOINT ["/usr/local/bin/program"]
