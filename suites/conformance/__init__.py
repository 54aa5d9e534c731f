"""Property-based conformance suite: one test per conformance property.

Run it against any backend:

    pytest --pyargs suites.conformance --backend SPEC [--conformance-profile ci|thorough]
    attn-harness conform --backend SPEC
"""
