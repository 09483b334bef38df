#!/usr/bin/env python3
"""A reader of Debezium SQL Server change events in Kafka Connect's JSON form
(JsonConverter, schemas.enable=true), written from Kafka Connect's and Debezium's
documented rules, not from mssql-ces's code: it converts every key and value to
Connect data as JsonConverter.toConnectData would (refusing what that refuses),
then checks the envelope as a Debezium consumer relies on it.

Input: the JSON lines mssql-ces's file sink writes for event.format = "debezium"
({"topic","key","value","headers"}). Output: a JSON summary on stdout; exit 1 with
the errors listed when any record is not what a Connect sink could read.

Usage: connect_json_reader.py FILE
"""
import base64
import datetime
import decimal
import json
import re
import sys

LSN = re.compile(r"^[0-9a-f]{8}:[0-9a-f]{8}:[0-9a-f]{4}$")
RANGES = {"int8": 2**7, "int16": 2**15, "int32": 2**31, "int64": 2**63}
ENVELOPE = ["before", "after", "source", "transaction", "op", "ts_ms", "ts_us", "ts_ns"]
SOURCE = ["version", "connector", "name", "ts_ms", "snapshot", "db", "sequence", "ts_us",
          "ts_ns", "schema", "table", "change_lsn", "commit_lsn", "event_serial_no"]


class Invalid(Exception):
    pass


def to_connect(schema, value, path):
    """JsonConverter.convertToConnect: the value as Connect data, or Invalid."""
    if value is None:
        if schema.get("default") is not None:
            return schema["default"]
        if not schema["optional"]:
            raise Invalid(f"{path}: null for a required {schema['type']}")
        return None
    kind = schema["type"]
    name = schema.get("name")
    if kind in RANGES:
        if not isinstance(value, int) or isinstance(value, bool):
            raise Invalid(f"{path}: {value!r} is not an integer")
        if not -RANGES[kind] <= value < RANGES[kind]:
            raise Invalid(f"{path}: {value} overflows {kind}")
        if name == "org.apache.kafka.connect.data.Date":
            return datetime.date(1970, 1, 1) + datetime.timedelta(days=value)
        if name == "org.apache.kafka.connect.data.Time":
            return (datetime.datetime(1970, 1, 1) + datetime.timedelta(milliseconds=value)).time()
        if name == "org.apache.kafka.connect.data.Timestamp":
            return datetime.datetime(1970, 1, 1) + datetime.timedelta(milliseconds=value)
        return value
    if kind in ("float", "double"):
        if isinstance(value, str) and value in ("NaN", "Infinity", "-Infinity"):
            return float(value)
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise Invalid(f"{path}: {value!r} is not a number")
        return float(value)
    if kind == "boolean":
        if not isinstance(value, bool):
            raise Invalid(f"{path}: {value!r} is not a boolean")
        return value
    if kind == "string":
        if not isinstance(value, str):
            raise Invalid(f"{path}: {value!r} is not a string")
        return value
    if kind == "bytes":
        if not isinstance(value, str):
            raise Invalid(f"{path}: bytes must be base64 text")
        raw = base64.b64decode(value, validate=True)
        if name == "org.apache.kafka.connect.data.Decimal":
            scale = int(schema["parameters"]["scale"])
            unscaled = int.from_bytes(raw, "big", signed=True)
            return decimal.Decimal(unscaled).scaleb(-scale)
        return raw
    if kind == "array":
        if not isinstance(value, list):
            raise Invalid(f"{path}: not an array")
        return [to_connect(schema["items"], v, f"{path}[{i}]") for i, v in enumerate(value)]
    if kind == "struct":
        if not isinstance(value, dict):
            raise Invalid(f"{path}: not an object")
        fields = [f["field"] for f in schema["fields"]]
        if list(value.keys()) != fields:
            raise Invalid(f"{path}: fields {list(value.keys())} are not the schema's {fields}")
        return {f["field"]: to_connect(f, value[f["field"]], f"{path}.{f['field']}")
                for f in schema["fields"]}
    raise Invalid(f"{path}: unknown type {kind}")


def check_schema_keys(schema, path):
    """Every schema object's keys come in JsonConverter's order."""
    order = ["type", "fields", "items", "optional", "name", "version", "doc",
             "parameters", "default", "field"]
    keys = list(schema.keys())
    if keys != sorted(keys, key=order.index) or "optional" not in schema:
        raise Invalid(f"{path}: schema keys {keys} are not in JsonConverter's order")
    for i, f in enumerate(schema.get("fields", [])):
        check_schema_keys(f, f"{path}.fields[{i}]")
    if "items" in schema:
        check_schema_keys(schema["items"], f"{path}.items")


def connect(message, what):
    if list(message.keys()) != ["schema", "payload"]:
        raise Invalid(f"{what}: keys {list(message.keys())} are not schema, payload")
    check_schema_keys(message["schema"], what)
    return to_connect(message["schema"], message["payload"], what)


def main(path):
    errors, ops = [], {}
    counts = {"records": 0, "tombstones": 0, "transactions": 0, "schema_changes": 0}
    last_delete_key = {}
    open_tx = None
    for n, line in enumerate(open(path, encoding="utf-8"), 1):
        counts["records"] += 1
        try:
            record = json.loads(line)
            topic, key, value = record["topic"], record["key"], record["value"]
            if not record["headers"].get("id"):
                raise Invalid("no id header")
            if value is None:
                counts["tombstones"] += 1
                if last_delete_key.get(topic) != json.dumps(key):
                    raise Invalid("a tombstone that does not follow a delete of its key")
                continue
            data = connect(value, "value")
            if value["schema"].get("name") == "io.debezium.connector.sqlserver.SchemaChangeValue":
                key_data = connect(key, "key")
                if key_data["databaseName"] != data["databaseName"]:
                    raise Invalid("a schema change keyed by another database")
                for change in data["tableChanges"]:
                    if change["type"] not in ("CREATE", "ALTER", "DROP"):
                        raise Invalid(f"table change type {change['type']}")
                counts["schema_changes"] += 1
                continue
            if topic.endswith(".transaction"):
                connect(key, "key")
                status = data["status"]
                if status == "BEGIN":
                    if open_tx is not None:
                        raise Invalid("BEGIN inside an open transaction")
                    open_tx = {"id": data["id"], "events": 0, "per": {}}
                else:
                    if open_tx is None or open_tx["id"] != data["id"]:
                        raise Invalid("END of a transaction that is not open")
                    per = {c["data_collection"]: c["event_count"] for c in data["data_collections"]}
                    if data["event_count"] != open_tx["events"] or per != open_tx["per"]:
                        raise Invalid(f"END counts {data['event_count']} {per} != seen {open_tx}")
                    counts["transactions"] += 1
                    open_tx = None
                continue
            schema = value["schema"]
            if [f["field"] for f in schema["fields"]] != ENVELOPE:
                raise Invalid("envelope fields out of order")
            if not schema["name"].endswith(".Envelope") or schema.get("version") != 2:
                raise Invalid("not a version 2 Envelope")
            prefix = schema["name"][: -len(".Envelope")]
            source = data["source"]
            if list(source.keys()) != SOURCE:
                raise Invalid("source fields out of order")
            if source["connector"] != "sqlserver":
                raise Invalid("connector is not sqlserver")
            # Debezium's topic naming: characters Kafka does not allow become "_".
            expected = re.sub(r"[^A-Za-z0-9._-]", "_",
                              f"{source['name']}.{source['db']}.{source['schema']}.{source['table']}")
            if prefix != expected or topic != expected:
                raise Invalid(f"names {prefix} / topic {topic} are not {expected}")
            op = data["op"]
            ops[op] = ops.get(op, 0) + 1
            before, after = data["before"], data["after"]
            shape = {"c": (False, True), "r": (False, True), "u": (True, True), "d": (True, False)}
            if op not in shape or ((before is not None), (after is not None)) != shape[op]:
                raise Invalid(f"op {op} with before={before is not None} after={after is not None}")
            if not LSN.match(source["commit_lsn"]):
                raise Invalid("commit_lsn is not xxxxxxxx:xxxxxxxx:xxxx")
            if op == "r":
                # An initial load's row, or a re-snapshot's.
                if source["snapshot"] not in ("true", "incremental") or source["change_lsn"] is not None:
                    raise Invalid("a read without snapshot=true or incremental")
            else:
                if source["snapshot"] != "false" or not LSN.match(source["change_lsn"]):
                    raise Invalid("a change without its change_lsn")
                if not isinstance(source["event_serial_no"], int) or source["event_serial_no"] < 1:
                    raise Invalid("event_serial_no")
            if key is not None:
                key_data = connect(key, "key")
                if key["schema"]["name"] != prefix + ".Key":
                    raise Invalid("key schema name")
                row = after if after is not None else before
                if any(row[k] != v for k, v in key_data.items()):
                    raise Invalid(f"key {key_data} is not the row's")
            if op == "d":
                last_delete_key[topic] = json.dumps(key)
            tx = data["transaction"]
            if open_tx is not None:
                if tx is None or tx["id"] != open_tx["id"]:
                    raise Invalid("an event of an open transaction without its block")
                open_tx["events"] += 1
                collection = f"{source['db']}.{source['schema']}.{source['table']}"
                open_tx["per"][collection] = open_tx["per"].get(collection, 0) + 1
                if tx["total_order"] != open_tx["events"] or tx["data_collection_order"] != open_tx["per"][collection]:
                    raise Invalid(f"transaction block {tx} != seen {open_tx}")
        except (Invalid, KeyError, ValueError, TypeError) as e:
            errors.append(f"line {n}: {e}")
            if len(errors) > 20:
                break
    if open_tx is not None and not errors:
        errors.append(f"transaction {open_tx['id']} has no END")
    print(json.dumps({**counts, "ops": ops, "errors": errors}))
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
