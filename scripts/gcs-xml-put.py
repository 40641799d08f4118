#!/usr/bin/env python3
"""Serves fake-gcs-server on 127.0.0.1:PORT with the one XML-API call it lacks.

    gcs-xml-put.py PORT UPSTREAM_PORT

object_store's GCS client speaks GCS's XML API. fake-gcs-server (fsouza, 1.54) answers its
GET, HEAD, DELETE and ListObjectsV2 (`GET /BUCKET?list-type=2`), but not its upload, a plain
`PUT /BUCKET/OBJECT`: that request gets 400 "invalid uploadType" (fake-gcs-server issue
#331; object_store's own CI runs a fork that adds it, which no package index ships). This
proxy forwards every request unchanged except that one, which it turns into the JSON API's
multipart upload (`POST /upload/storage/v1/b/BUCKET/o?uploadType=multipart`) carrying the
same object, content type, `x-goog-meta-*` metadata and `x-goog-if-generation-match`
precondition (as `ifGenerationMatch`), and whose answer it turns back into the XML API's
(status, `ETag` and `x-goog-generation`, no body). So fake-gcs-server itself stores the
object and its metadata and decides the precondition; nothing here keeps state.

Not translated (object_store calls that kvtier does not use): XML multipart uploads
(`POST ?uploads`, `PUT ?partNumber=&uploadId=`) and copies (`x-goog-copy-source`).
"""

import http.client
import json
import secrets
import sys
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PORT, UPSTREAM = int(sys.argv[1]), int(sys.argv[2])
HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "proxy-connection"}
# Path prefixes of fake-gcs-server's own (non-XML) routes: forwarded as they are.
NATIVE = ("/storage/", "/upload/", "/download/", "/batch/", "/_internal/")


class Proxy(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Headers and body go out in separate writes: without this, Nagle's algorithm and the
    # client's delayed ACK hold each answer's body back for 40 ms.
    disable_nagle_algorithm = True

    def log_message(self, fmt, *args):  # the access log of fake-gcs-server is enough
        pass

    def body(self):
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            out = b""
            while True:
                size = int(self.rfile.readline().split(b";")[0], 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return out
                out += self.rfile.read(size)
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def upstream(self, method, target, body, headers):
        conn = http.client.HTTPConnection("127.0.0.1", UPSTREAM, timeout=120)
        try:
            conn.request(method, target, body=body, headers=headers)
            resp = conn.getresponse()
            return resp.status, resp.getheaders(), resp.read()
        finally:
            conn.close()

    def answer(self, status, headers, body):
        self.send_response(status)  # adds Server and Date
        length = str(len(body))
        for k, v in headers:
            if k.lower() == "content-length" and self.command == "HEAD":
                length = v  # the object's size, which HEAD answers without the object
            elif k.lower() not in HOP and k.lower() not in ("content-length", "server", "date"):
                self.send_header(k, v)
        self.send_header("Content-Length", length)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def xml_put(self):
        """Whether this is an XML-API object upload: PUT /BUCKET/OBJECT without a query."""
        url = urllib.parse.urlsplit(self.path)
        return (self.command == "PUT" and not url.query and not url.path.startswith(NATIVE)
                and url.path.count("/") >= 2 and not url.path.endswith("/")
                and "x-goog-copy-source" not in self.headers)

    def forward(self):
        body = self.body() if self.command not in ("GET", "HEAD", "DELETE") or self.headers.get("Content-Length") else None
        if not self.xml_put():
            headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP}
            self.answer(*self.upstream(self.command, self.path, body, headers))
            return
        bucket, name = urllib.parse.urlsplit(self.path).path[1:].split("/", 1)
        bucket, name = urllib.parse.unquote(bucket), urllib.parse.unquote(name)
        resource = {"name": name, "contentType": self.headers.get("Content-Type") or "application/octet-stream"}
        for header, field in (("Content-Encoding", "contentEncoding"), ("Cache-Control", "cacheControl"),
                              ("Content-Disposition", "contentDisposition"), ("Content-Language", "contentLanguage")):
            if self.headers.get(header):
                resource[field] = self.headers[header]
        metadata = {k.lower()[len("x-goog-meta-"):]: v for k, v in self.headers.items()
                    if k.lower().startswith("x-goog-meta-")}
        if metadata:
            resource["metadata"] = metadata
        query = {"uploadType": "multipart", "name": name}
        if self.headers.get("x-goog-if-generation-match") is not None:
            query["ifGenerationMatch"] = self.headers["x-goog-if-generation-match"]
        boundary = secrets.token_hex(16)
        multipart = (f"--{boundary}\r\nContent-Type: application/json; charset=UTF-8\r\n\r\n{json.dumps(resource)}\r\n"
                     f"--{boundary}\r\nContent-Type: {resource['contentType']}\r\n\r\n").encode() \
            + (body or b"") + f"\r\n--{boundary}--\r\n".encode()
        target = f"/upload/storage/v1/b/{urllib.parse.quote(bucket, safe='')}/o?{urllib.parse.urlencode(query)}"
        status, headers, answer = self.upstream("POST", target, multipart,
                                                {"Content-Type": f"multipart/related; boundary={boundary}"})
        if status != 200:
            self.answer(status, [h for h in headers if h[0].lower() == "content-type"], answer)
            return
        obj = json.loads(answer)
        self.answer(200, [("ETag", f'"{obj["etag"]}"'), ("x-goog-generation", str(obj["generation"])),
                          ("x-goog-metageneration", str(obj.get("metageneration", "1")))], b"")

    do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = do_PATCH = forward


ThreadingHTTPServer.daemon_threads = True
ThreadingHTTPServer(("127.0.0.1", PORT), Proxy).serve_forever()
