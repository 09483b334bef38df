# mssql-ces in a container: built in a Rust image, run from a slim Debian image as a
# non-root user, with the stripped release binary only.
#
#   docker build -t mssql-ces .
#   docker run --rm -v "$PWD/my.toml:/config.toml:ro" \
#     -e MSSQL_CES__SOURCE__CONNECTION_STRING='Server=tcp:db,1433;…' \
#     mssql-ces run --config /config.toml
#
# (my.toml names hosts as the container sees them: not localhost.)
#
# Every setting can also come from the environment (MSSQL_CES__SINK__TOPIC=…), and a
# secret setting's variable holds the secret itself (MSSQL_CES__SINK__CONNECTION_STRING).

FROM rust:1.89-slim-bookworm AS build
# librdkafka (built from source by rdkafka-sys) and OpenSSL need a C toolchain.
RUN apt-get update \
 && apt-get install -y --no-install-recommends build-essential perl pkg-config libssl-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src ./src
COPY benches ./benches
# Workspace members and declared test targets must exist for cargo to read the
# manifest, though only the binary is built.
COPY crates ./crates
COPY tests ./tests
COPY schemas ./schemas
RUN cargo build --release --locked --bin mssql-ces \
 && cp target/release/mssql-ces /mssql-ces

FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates libssl3 \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --home-dir /var/lib/mssql-ces --create-home mssql-ces
COPY --from=build /mssql-ces /usr/local/bin/mssql-ces
COPY examples /etc/mssql-ces/examples
USER mssql-ces
# The file checkpoint store writes here unless checkpoint.path says otherwise.
WORKDIR /var/lib/mssql-ces
VOLUME ["/var/lib/mssql-ces"]
ENTRYPOINT ["/usr/local/bin/mssql-ces"]
CMD ["run", "--config", "/etc/mssql-ces/examples/docker.toml"]
