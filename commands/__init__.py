"""The command line's verbs, one module each; each parses its options and calls one library function.

``memdpc.cli`` names them and imports a verb's module when it is named. A verb imports its stage when it runs,
so that ``memdpc --help`` starts without torch; the options are generated from the library's configs
(:mod:`memdpc.commands.options`).
"""
