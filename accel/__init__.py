"""softhca.accel: native code for the engine, built by ``make`` (accel/Makefile).

``_native`` is the C extension with the engine's per-transfer work (accel/native.c):
block signature check / generate / strip and AES-XTS over every block or data unit of
a transfer in one call. softhca.engine.backend decides whether it is used; nothing
imports it directly.
"""
