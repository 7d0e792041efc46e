"""The ThreadSanitizer annotations of Abseil's synchronization (tests/tsan).

Add TSAN_DEPS to the deps of every binary and test that runs under
--config=tsan: the tests and each program they start. It is empty in any
other build.
"""

TSAN_DEPS = select({
    "//tests/tsan:enabled": ["//tests/tsan:sync_annotations"],
    "//conditions:default": [],
})
