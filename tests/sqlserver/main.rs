//! The suite against a real SQL Server (the docker test bed of `docker-compose.yml`
//! and `sql/`). See `sqlserver_integration` for how to run it and how it reports a
//! server it cannot reach.

mod schema_evolution;
mod server_facts;
mod sqlserver_integration;
