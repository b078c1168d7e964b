"""Facts about ONNX protos that every part of ``onnxq.ir`` shares."""


# Protobuf cannot serialize a message of 2 GiB or more; stay well below it.
PROTO_LIMIT = 2**31 - 2**26
DEFAULT_DOMAINS = ("", "ai.onnx")



