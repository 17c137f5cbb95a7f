"""An independent reader of TensorBoard event files, for the tests of dtrain's writer.

It shares no code with dtrain: TFRecord framing and CRC32C (Castagnoli, bit-reflected, computed
here from its polynomial), the Event protocol buffer parsed by google.protobuf (TensorBoard's
dependency) from a descriptor built here with TensorBoard's own field numbers
(tensorboard/compat/proto/event.proto and summary.proto):

    message Event   { double wall_time = 1; int64 step = 2;
                      oneof what { string file_version = 3; Summary summary = 5; ... } }
    message Summary { repeated Value value = 1;
                      message Value { string tag = 1;
                                      oneof value { float simple_value = 2; ... } } }

Fields TensorBoard defines and dtrain does not write are left out of the descriptor; protobuf
keeps any such field as unknown, so a stray one still parses (and the tests look for none).

    python3 tensorboard_events.py DIR_OR_FILE...   # prints every scalar: file step tag value
"""

import glob
import os
import struct
import sys

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

FILE_VERSION = "brain.Event:2"


def _messages():
    f = descriptor_pb2.FileDescriptorProto(name="dtrain_test_event.proto", package="tensorboard",
                                           syntax="proto3")
    T = descriptor_pb2.FieldDescriptorProto
    value = f.message_type.add(name="SummaryValue")
    value.field.add(name="tag", number=1, type=T.TYPE_STRING, label=T.LABEL_OPTIONAL)
    value.field.add(name="simple_value", number=2, type=T.TYPE_FLOAT, label=T.LABEL_OPTIONAL)
    summary = f.message_type.add(name="Summary")
    summary.field.add(name="value", number=1, type=T.TYPE_MESSAGE, label=T.LABEL_REPEATED,
                      type_name=".tensorboard.SummaryValue")
    event = f.message_type.add(name="Event")
    event.field.add(name="wall_time", number=1, type=T.TYPE_DOUBLE, label=T.LABEL_OPTIONAL)
    event.field.add(name="step", number=2, type=T.TYPE_INT64, label=T.LABEL_OPTIONAL)
    event.field.add(name="file_version", number=3, type=T.TYPE_STRING, label=T.LABEL_OPTIONAL)
    event.field.add(name="summary", number=5, type=T.TYPE_MESSAGE, label=T.LABEL_OPTIONAL,
                    type_name=".tensorboard.Summary")
    pool = descriptor_pool.DescriptorPool()
    pool.Add(f)
    desc = pool.FindMessageTypeByName("tensorboard.Event")
    if hasattr(message_factory, "GetMessageClass"):
        return message_factory.GetMessageClass(desc)
    return message_factory.MessageFactory(pool).GetPrototype(desc)


Event = _messages()


def _crc32c_table():
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
        table.append(crc)
    return table


_CRC32C_TABLE = _crc32c_table()


def crc32c(data):
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _CRC32C_TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


assert crc32c(b"123456789") == 0xE3069283, "CRC32C check value"


def masked_crc(data):
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


class BadRecord(Exception):
    pass


def read_records(path):
    """The data of every complete record of `path`, each CRC checked, and how many bytes of a
    torn record follow the last complete one (a writer killed mid-write). A bad CRC or an
    impossible length raises BadRecord naming the offset."""
    with open(path, "rb") as f:
        raw = f.read()
    out = []
    at = 0
    while at < len(raw):
        if len(raw) - at < 12:
            return out, len(raw) - at
        header = raw[at:at + 8]
        (length,) = struct.unpack("<Q", header)
        (crc,) = struct.unpack("<I", raw[at + 8:at + 12])
        if crc != masked_crc(header):
            raise BadRecord(f"{path}: record at offset {at}: the length's CRC does not match")
        if len(raw) - at < 12 + length + 4:
            return out, len(raw) - at
        data = raw[at + 12:at + 12 + length]
        (crc,) = struct.unpack("<I", raw[at + 12 + length:at + 16 + length])
        if crc != masked_crc(data):
            raise BadRecord(f"{path}: record at offset {at}: the data's CRC does not match")
        out.append(data)
        at += 16 + length
    return out, 0


def parse_event(data):
    event = Event()
    event.ParseFromString(data)
    return event


def event_files(path):
    if os.path.isdir(path):
        return sorted(glob.glob(os.path.join(path, "*tfevents*")))
    return [path]


def read_file(name):
    """One event file: {"opened": the first record's wall_time, "events": [(wall_time, step,
    [(tag, value), ...]) for every later record], "torn": bytes of a torn last record}, checking
    every CRC and that the file opens with the file_version record and nothing else."""
    records, torn = read_records(name)
    if not records:
        raise BadRecord(f"{name}: no complete record")
    first = parse_event(records[0])
    if first.file_version != FILE_VERSION or first.HasField("summary"):
        raise BadRecord(f"{name}: the first record is not the file_version event: {first}")
    events = []
    for data in records[1:]:
        event = parse_event(data)
        if event.file_version:
            raise BadRecord(f"{name}: a second file_version record")
        events.append((event.wall_time, event.step,
                       [(v.tag, v.simple_value) for v in event.summary.value]))
    return {"opened": first.wall_time, "events": events, "torn": torn}


def scalars(path):
    """(wall_time, step, tag, value) of every scalar in every event file of `path`, and the
    bytes of torn last records."""
    found = []
    torn = 0
    for name in event_files(path):
        f = read_file(name)
        torn += f["torn"]
        for wall, step, values in f["events"]:
            found.extend((wall, step, tag, value) for tag, value in values)
    return found, torn


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        values, torn = scalars(arg)
        for wall, step, tag, value in values:
            print(f"{wall:.3f} {step} {tag} {value!r}")
        if torn:
            print(f"# {torn} bytes of a torn last record", file=sys.stderr)
