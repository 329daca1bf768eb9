"""gcp-storage-emulator with its XML API completed, for lazytrain's GCS tests.

Usage: python3 gcs_emulator.py start --host 127.0.0.1 --port PORT --in-memory

The emulator (PyPI `gcp-storage-emulator`) speaks GCS's JSON API fully but
its XML API, which object_store uses for reads, writes and listing, lacks
what real GCS sends: `Last-Modified` and `ETag` on object GETs, an `ETag`
on PUTs, HEAD on objects, and `GET /{bucket}?list-type=2` listings. This
adds those, as GCS documents them, and changes nothing else. (The issue
suggested fake-gcs-server; it is a Go binary with no package on PyPI, npm
or Debian, so it cannot be installed here.)
"""

import email.utils
import sys
from datetime import datetime
from http import HTTPStatus
from xml.sax.saxutils import escape

from gcp_storage_emulator import server
from gcp_storage_emulator.__main__ import main
from gcp_storage_emulator.handlers import objects


def _object(storage, request):
    return storage.get_file_obj(request.params["bucket_name"], request.params["object_id"])


def _http_date(rfc3339):
    moment = datetime.strptime(rfc3339, "%Y-%m-%dT%H:%M:%S.%fZ")
    return email.utils.format_datetime(moment.replace(tzinfo=__import__("datetime").timezone.utc), usegmt=True)


def _version_headers(response, obj):
    response["Last-Modified"] = _http_date(obj["updated"])
    response["ETag"] = '"{}"'.format(obj.get("etag") or obj.get("md5Hash") or obj["generation"])
    response["x-goog-generation"] = obj["generation"]


def download(request, response, storage, *args, **kwargs):
    objects.download(request, response, storage, *args, **kwargs)
    if response.status in (HTTPStatus.OK, HTTPStatus.PARTIAL_CONTENT):
        _version_headers(response, _object(storage, request))


def xml_upload(request, response, storage, *args, **kwargs):
    objects.xml_upload(request, response, storage, *args, **kwargs)
    if response.status == HTTPStatus.OK:
        _version_headers(response, _object(storage, request))


def xml_list(request, response, storage, *args, **kwargs):
    bucket = request.params["bucket_name"]
    if storage.get_bucket(bucket) is None:
        response.status = HTTPStatus.NOT_FOUND
        return
    prefix = (request.query.get("prefix") or [""])[0]
    delimiter = (request.query.get("delimiter") or [None])[0]
    contents, prefixes = [], set()
    for name, obj in sorted(storage.objects.get(bucket, {}).items()):
        if not name.startswith(prefix):
            continue
        rest = name[len(prefix):]
        if delimiter and delimiter in rest:
            prefixes.add(prefix + rest.split(delimiter, 1)[0] + delimiter)
            continue
        contents.append(
            "<Contents><Key>{}</Key><LastModified>{}</LastModified><ETag>\"{}\"</ETag><Size>{}</Size></Contents>".format(
                escape(name), obj["updated"], obj.get("etag") or obj["generation"], obj["size"]
            )
        )
    common = "".join("<CommonPrefixes><Prefix>{}</Prefix></CommonPrefixes>".format(escape(p)) for p in sorted(prefixes))
    response["Content-Type"] = "application/xml"
    response.write(
        '<?xml version="1.0" encoding="UTF-8"?><ListBucketResult><Name>{}</Name><Prefix>{}</Prefix>{}{}'
        "</ListBucketResult>".format(escape(bucket), escape(prefix), "".join(contents), common)
    )


def do_head(handler):
    """HEAD: the GET route's status and headers, without the body."""
    real = handler.wfile

    class Discard:
        def write(self, data):
            return len(data)

        def flush(self):
            real.flush()

    end_headers = handler.end_headers

    def end_then_discard():
        end_headers()
        handler.wfile = Discard()

    handler.end_headers = end_then_discard
    try:
        server.Router(handler).handle(server.GET)
    finally:
        handler.wfile = real


for _regex, methods in server.HANDLERS:
    for method, handler in list(methods.items()):
        if handler is objects.download:
            methods[method] = download
        elif handler is objects.xml_upload:
            methods[method] = xml_upload
server.HANDLERS = server.HANDLERS + ((r"^/(?P<bucket_name>[-.\w]+)/?$", {server.GET: xml_list}),)
server.RequestHandler.do_HEAD = do_head

if __name__ == "__main__":
    main(sys.argv[1:])
