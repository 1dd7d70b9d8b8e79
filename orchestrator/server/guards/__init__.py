"""Guards every surface of ``toolfleet serve`` goes through, one module each.

::

    outbound.py    the one HTTP client for addresses users name (webhooks): the address
                   check, a deadline per try, a capped answer, a per-tenant pool share
    account.py     the tenant's account: bytes, counts and retention of what it stores
    runlist.py     a thread's runs by page, for every route that lists or walks them
    clientview.py  what a client may see of a run's events: no internal names
"""
