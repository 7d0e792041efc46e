"""Compiler flags for syncnorm's own code (not for generated or system code)."""

SYNCNORM_COPTS = [
    "-Wall",
    "-Wextra",
    "-Werror",
    "-Wno-sign-compare",
    "-Wno-unused-parameter",
]
