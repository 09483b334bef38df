#!/usr/bin/env python3
"""Decodes Confluent wire-format Avro records with the Confluent Python client's
AvroDeserializer (confluent-kafka 2.x), fetching each schema by id from the
registry, as a Kafka consumer would: an independent reader of what mssql-ces
writes with [sink.schema_registry].

Input: lines "topic<TAB>key hex<TAB>value hex" (an empty field for no key / a
tombstone). Output: one JSON line per record, {"topic","key","value"} decoded
(decimals, dates and datetimes as text).

Keys are Avro too with KEYS = "avro" (Debezium's); with "string" they are text
(CES's keys, as Kafka's StringSerializer writes them).

Usage: avro_deserialize.py REGISTRY_URL FILE KEYS
"""
import json
import sys

from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer
from confluent_kafka.serialization import MessageField, SerializationContext


def main(url, path, keys):
    client = SchemaRegistryClient({"url": url})
    deserialize = AvroDeserializer(client)
    for line in open(path, encoding="utf-8"):
        topic, key, value = line.rstrip("\n").split("\t")
        out = {"topic": topic}
        for name, text, field in (("key", key, MessageField.KEY), ("value", value, MessageField.VALUE)):
            if not text:
                out[name] = None
            elif field == MessageField.KEY and keys == "string":
                out[name] = bytes.fromhex(text).decode("utf-8")
            else:
                out[name] = deserialize(bytes.fromhex(text), SerializationContext(topic, field))
        print(json.dumps(out, default=str))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3])
