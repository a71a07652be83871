"""softhca.engine: the device model, pure and synchronous (no sockets, no clocks).

- ``hca``: the HCA and what it owns (DEKs, MKEYs), the key table; ``memory``: PD and
  MR (host memory as the device sees it).
- ``mkey``: the MKEY and its layouts; ``mkey_configure``: the configure WR builder.
- ``signature``: the sig setter's rules and per-block check / copy / generate / strip.
- ``guards``: T10-DIF, CRC32, CRC32C, CRC64_XP10 and IP checksum guards, many blocks a call.
- ``crypto`` and ``xts``: the crypto setter's rules and batched AES-XTS.
- ``crypto_login``: the device's crypto import method, crypto login, wrapped DEK import.
- ``transfer``: TX (memory to wire) and RX (wire to memory) through a key.
- ``backend``: which implementation does the per-block work: the native accelerator
  (softhca.accel._native, accel/) or the Python modules above (SOFTHCA_ENGINE).
- ``keyplan``: the plan of an MKEY's configuration, built once for its transfers, and
  the scratch buffers they run in.
- ``completion``: which ibv_wc_status a failed transfer gives.
- ``rc``: the RC QP (sans-I/O), composed of ``rc_requester`` (the send queue),
  ``rc_completer`` (what comes back for it) and ``rc_responder`` (the receive queue), as
  rxe splits it; ``rc_common`` what they share; ``qp_state``: the QP state machine (the
  ibv_modify_qp transition table, the states each verb needs) and the IBTA timer
  encodings.
"""
