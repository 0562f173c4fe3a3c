# syntax=docker/dockerfile:1
#
# lockgate production image: the static proxy binary on distroless, run as
# a non-root user. Build:  docker build -t lockgate .
# The dev stack (cmd/devstack, embedded FerretDB) is deliberately not built
# here.

ARG GO_VERSION=1.26

FROM golang:${GO_VERSION}-bookworm AS build
WORKDIR /src
# Dependencies first, so source edits do not invalidate the module cache.
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=dev
# CGO off: a static binary needs no libc in the runtime image. go build
# optimizes with cmd/proxy/default.pgo, the proxy's CPU profile, by itself.
RUN CGO_ENABLED=0 GOOS=linux go build -trimpath \
      -ldflags "-s -w -X main.version=${VERSION}" \
      -o /out/lockgate ./cmd/proxy
# The image's default config passes everything through (policy.default:
# off) and opens the admin port to the kubelet's probes. Real deployments
# mount their own file over it; config.example.yaml documents every key.
RUN printf '%s\n' \
      '# Default image config: see config.example.yaml for every key.' \
      'listen: 127.0.0.1:27018' \
      'admin: 0.0.0.0:9218' \
      'policy:' \
      '  default: off' > /out/config.yaml

# distroless/static ships CA certificates (for TLS to the upstream and
# mongodb+srv) and /etc/passwd with the nonroot user, and nothing else.
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/lockgate /usr/local/bin/lockgate
COPY --from=build /out/config.yaml /etc/lockgate/config.yaml
USER 65532:65532
# 27018: MongoDB clients; 9218: /metrics, /healthz, /readyz.
EXPOSE 27018 9218
ENTRYPOINT ["/usr/local/bin/lockgate", "-config", "/etc/lockgate/config.yaml"]
