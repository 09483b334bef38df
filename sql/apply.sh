#!/usr/bin/env bash
# Applies sql/0*.sql to the docker SQL Server (run by the mssql-setup service), then
# stays up so that `docker compose up --wait` can see it healthy.
set -euo pipefail
sqlcmd=/opt/mssql-tools18/bin/sqlcmd
for script in /sql/0*.sql; do
  echo "applying ${script}"
  "$sqlcmd" -S mssql -U sa -P "$MSSQL_SA_PASSWORD" -C -b \
    -v CES_PASSWORD="$MSSQL_CES_PASSWORD" -i "$script"
done
touch /tmp/ready
echo "sample database CesDemo ready"
exec sleep infinity
