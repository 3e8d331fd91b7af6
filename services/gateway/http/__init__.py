"""What every resource's HTTP surface shares: authentication and roles, problem responses,
server-sent event streams, body limits and streamed uploads, path and page parameters, the
security refusals a request records, and the listening socket the gateway's replicas share.
Nothing here imports a resource.
"""
