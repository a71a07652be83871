"""Two-node integration tests: this host is the initiator, a `softhca serve` elsewhere is
the target (its address in SOFTHCA_TARGET). Marker ``twonode``; skipped without a target.

They run in the compose topology (docker/compose.yaml, the ``initiator`` service) and in
the same topology built from network namespaces by tests/containers/test_twonode_netns.py.
"""
