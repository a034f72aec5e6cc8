# A static student-controller on a distroless base that runs as non-root.
#   docker build -t student-controller:latest .
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY cmd/ cmd/
COPY internal/ internal/
COPY pkg/ pkg/
ARG VERSION=devel
RUN CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X main.version=${VERSION}" \
    -o /student-controller ./cmd/student-controller

FROM gcr.io/distroless/static:nonroot
COPY --from=build /student-controller /student-controller
USER 65532:65532
ENTRYPOINT ["/student-controller"]
