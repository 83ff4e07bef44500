# orderpay: multi-stage build. The runtime image holds one static-ish binary and runs as a
# non-root user. (Written for users; the machines this project is built on have no Docker engine,
# so this file is checked by reading, not by running.)

FROM rust:1.95-slim-bookworm AS build
WORKDIR /src
# Dependencies first, so that source edits do not rebuild them.
COPY Cargo.toml Cargo.lock ./
RUN mkdir src && echo 'fn main() {}' > src/main.rs && touch src/lib.rs \
    && cargo build --release --locked --bin orderpay || true
COPY src src
COPY migrations migrations
COPY openapi.yaml openapi.yaml
RUN touch src/main.rs src/lib.rs && cargo build --release --locked --bin orderpay

FROM debian:bookworm-slim AS runtime
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates curl \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --no-create-home orderpay
COPY --from=build /src/target/release/orderpay /usr/local/bin/orderpay
USER orderpay
ENV ORDERPAY_LISTEN=0.0.0.0:8080 \
    ORDERPAY_LOG_FORMAT=json
EXPOSE 8080
HEALTHCHECK --interval=10s --timeout=3s --retries=3 CMD curl -fsS http://127.0.0.1:8080/healthz || exit 1
ENTRYPOINT ["orderpay"]
CMD ["serve"]
