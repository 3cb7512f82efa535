# syntax=docker/dockerfile:1
# The waitroom service image (docs/deploy.md).
#
#   docker build -t waitroom .
#   docker run --rm -p 8080:8080 -e WAITROOM_ADMIN_TOKEN=… -e WAITROOM_TOKEN_SECRET=… \
#     -e WAITROOM_REDIS_NODES=… -e WAITROOM_KAFKA_BROKERS=… -e WAITROOM_DATABASE_URL=… waitroom
#
# Two stages: the Rust toolchain image builds the release binary (rdkafka compiles librdkafka
# from source with the toolchain image's gcc, make, zlib and OpenSSL headers); a slim Debian of
# the same release runs it as an unprivileged user. Pin RUST_VERSION to the toolchain the
# project builds with.

ARG RUST_VERSION=1.95
ARG DEBIAN_RELEASE=bookworm

FROM rust:${RUST_VERSION}-${DEBIAN_RELEASE} AS build
# The CA bundle RDS server certificates chain to, for sslmode=verify-full
# (WAITROOM_DATABASE_URL's sslrootcert). ElastiCache and MSK use public CAs that
# ca-certificates already trusts.
ARG RDS_CA_BUNDLE_URL=https://truststore.pki.rds.amazonaws.com/global/global-bundle.pem
WORKDIR /src
RUN curl --fail --silent --show-error --location --proto '=https' --tlsv1.2 \
      --output /rds-global-bundle.pem "${RDS_CA_BUNDLE_URL}" \
 && grep -q 'BEGIN CERTIFICATE' /rds-global-bundle.pem
# Only what the build reads: the workspace manifests and lock file, the member crates (bench/ is
# not built, but the workspace must load), the Lua scripts and migrations (embedded in the
# binary), and tests/ (the manifest names a test target there).
COPY Cargo.toml Cargo.lock ./
COPY strategies ./strategies
COPY bench ./bench
COPY src ./src
COPY lua ./lua
COPY migrations ./migrations
COPY tests ./tests
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked \
 && install -D -m 0755 target/release/waitroom /out/waitroom

FROM debian:${DEBIAN_RELEASE}-slim AS runtime
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates libssl3 \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 10001 waitroom \
 && useradd --system --uid 10001 --gid waitroom --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin waitroom
COPY --from=build /out/waitroom /usr/local/bin/waitroom
COPY --from=build /rds-global-bundle.pem /etc/ssl/certs/rds-global-bundle.pem
# Production unless told otherwise: without real secrets the service refuses to start.
ENV WAITROOM_ENV=production \
    WAITROOM_HTTP_ADDR=0.0.0.0:8080 \
    WAITROOM_URL=http://127.0.0.1:8080 \
    RUST_LOG=info
USER 10001:10001
EXPOSE 8080
HEALTHCHECK --interval=10s --timeout=5s --start-period=30s --retries=3 \
  CMD ["/usr/local/bin/waitroom", "healthcheck", "--url", "http://127.0.0.1:8080"]
ENTRYPOINT ["/usr/local/bin/waitroom"]
CMD ["serve"]
