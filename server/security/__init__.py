"""Security building blocks: authenticators, entitlements, audit (the password file format and
the TLS contexts, which the configuration checks too, are protocol/security/).

    passwd_cli.py     `tickertape passwd FILE USER [--delete | --token]`
    authenticator.py  who a logon is: password file, client certificate, anonymous; back-off
    entitlements.py   what a user may do: roles, rights by topic regex, content filters
    audit.py          audit lines on the `tickertape.audit` logger

None of these modules imports the server core (app, connection, pipeline, replay, queues): the
core calls them. docs/security.md describes the whole and what is wired in today.
"""
