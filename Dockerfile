# Multi-stage build: a static binary on a minimal, non-root base.
FROM golang:1.26 AS build
WORKDIR /src
ENV GOTOOLCHAIN=auto CGO_ENABLED=0
COPY go.mod go.sum ./
RUN go mod download
COPY main.go ./
COPY pkg/ pkg/
ARG VERSION=dev
RUN go build -trimpath -ldflags "-s -w -X sigs.k8s.io/karpenter/pkg/operator.Version=${VERSION}" -o /out/karpenter-clusterapi .

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/karpenter-clusterapi /karpenter-clusterapi
USER 65532:65532
ENTRYPOINT ["/karpenter-clusterapi"]
