# An image for cohort's Python package (python/): CPython 3.11 with the `cohort` wheel and
# NumPy, run as the same non-root user as cohort's own image. Your job's image builds on it with
# your script (and PyTorch, if your steps use it):
#
#   docker build -f deploy/python.Dockerfile -t cohort-python:0.1.0 .     # from this repository
#   # your Dockerfile:
#   #   FROM cohort-python:0.1.0
#   #   RUN pip install --no-cache-dir torch==2.5.1
#   #   COPY train.py /app/train.py
#   #   CMD ["/app/train.py"]
#
# and in the manifests set `image:` to your image and `command: ["python", "/app/train.py"]`:
# every task runs the same script, its role from TF_CONFIG and its certificates from
# COHORT_CERTS, as a Rust program's tasks do (deploy/README.md).
# Dockerfile.dockerignore beside deploy/Dockerfile keeps target/ and .git out of the context.

# ---- build: the wheel (maturin, release), with the versions pinned in Cargo.lock ----
# Python's full image (it has the C compiler ring and mimalloc need) with the Rust toolchain of
# cohort's own image copied in.
FROM rust:1.95-slim-bookworm AS rust
FROM python:3.11-bookworm AS builder
COPY --from=rust /usr/local/rustup /usr/local/rustup
COPY --from=rust /usr/local/cargo /usr/local/cargo
ENV RUSTUP_HOME=/usr/local/rustup CARGO_HOME=/usr/local/cargo PATH=/usr/local/cargo/bin:$PATH
RUN pip install --no-cache-dir "maturin==1.16.0"
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    maturin build --release --locked -m python/Cargo.toml -o /wheels

# ---- runtime: Python, the wheel, its user ----
FROM python:3.11-slim-bookworm
RUN groupadd --system --gid 10001 cohort \
    && useradd --system --uid 10001 --gid cohort --no-create-home \
       --home-dir /var/lib/cohort --shell /usr/sbin/nologin cohort \
    && mkdir -p /var/lib/cohort /app \
    && chown cohort:cohort /var/lib/cohort
COPY --from=builder /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels
USER 10001:10001
# Where a role looks for ./cohort.toml; checkpoints go under it unless COHORT_CHECKPOINT_DIR
# says otherwise.
WORKDIR /var/lib/cohort
# QUIC (UDP) on the task's port in the cluster spec (2222: the training operator's default);
# metrics on 9100 where COHORT_METRICS_ADDR sets it.
EXPOSE 2222/udp 9100/tcp
ENTRYPOINT ["python"]
CMD ["-m", "cohort"]
