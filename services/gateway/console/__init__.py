"""The web console at /ui: server-rendered pages over the gateway's own service functions, a
session cookie for the browser, and a small script that calls the API."""
