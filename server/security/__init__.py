"""Security building blocks: password file, authenticators, entitlements, TLS contexts, audit.

    passwords.py      the password file format (scrypt hashes, bearer tokens); atomic writes
    passwd_cli.py     `tickertape passwd FILE USER [--delete | --token]`
    authenticator.py  who a logon is: password file, client certificate, anonymous; back-off
    entitlements.py   what a user may do: roles, rights by topic regex, content filters
    tls.py            ssl.SSLContext for a tcps transport / the admin endpoint, reload on SIGHUP
    audit.py          audit lines on the `tickertape.audit` logger

None of these modules imports the server core (app, connection, pipeline, replay, queues): the
core calls them. docs/security.md describes the whole and what is wired in today.
"""
