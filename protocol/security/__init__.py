"""The security primitives the configuration checks and the server uses: pure of the server.

    passwords.py  the password file format (scrypt hashes, bearer tokens); atomic writes
    tls.py        ssl.SSLContext for a tcps transport / the admin endpoint, reload on SIGHUP

The server's own security parts (authenticators, entitlements, audit) are in server/security/.
"""
