"""Support code for the tests, no test files: fixtures, stand-ins of other torch releases, subprocess drivers.

Imported as ``test.helpers.<module>``.
"""
