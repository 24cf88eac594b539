"""A real Schema Registry for tests and demos: Apicurio Registry's Confluent-compatible API.

:mod:`.app` finds the registry built by ``make registry`` (its sources in ``deploy/schema-registry/``),
:mod:`.embedded` runs it as a subprocess on loopback, :mod:`.wire` splits the Confluent wire format's
header (magic byte 0, the 4-byte schema id) from a record's body.
"""
