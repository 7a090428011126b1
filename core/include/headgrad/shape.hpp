// Shape: the sizes (or strides) of a tensor, a vector of int64 that keeps up
// to 6 dims inside the object. Every tensor, view and graph node holds one or
// two; as std::vector each was a heap call, and at small shapes those calls
// were a third of a forward + backward (docs/performance.md, "The small-shape
// overhead"). More than 6 dims spill to the heap. Its iterators are plain
// pointers, so a Shape is a contiguous range: std::span<const std::int64_t>
// takes it as a std::vector. (boost::container::small_vector would do the
// same but for that: its iterators are not contiguous iterators in C++20's
// sense, so no std::span can be made from one.)
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <iterator>
#include <span>
#include <stdexcept>
#include <vector>

namespace headgrad {

class Shape {
 public:
  using value_type = std::int64_t;
  using size_type = std::size_t;
  using difference_type = std::ptrdiff_t;
  using reference = value_type&;
  using const_reference = const value_type&;
  using pointer = value_type*;
  using const_pointer = const value_type*;
  using iterator = value_type*;
  using const_iterator = const value_type*;
  using reverse_iterator = std::reverse_iterator<iterator>;
  using const_reverse_iterator = std::reverse_iterator<const_iterator>;

  static constexpr size_type inline_capacity = 6;

  Shape() = default;
  Shape(std::initializer_list<value_type> values) { assign(values.begin(), values.end()); }
  explicit Shape(size_type count, value_type value = 0) { assign(count, value); }
  template <std::input_iterator It>
  Shape(It first, It last) { assign(first, last); }
  explicit Shape(std::span<const value_type> values) { assign(values.begin(), values.end()); }
  explicit Shape(const std::vector<value_type>& values) { assign(values.begin(), values.end()); }

  Shape(const Shape& other) { assign(other.begin(), other.end()); }
  Shape(Shape&& other) noexcept { take(other); }
  Shape& operator=(const Shape& other) {
    if (this != &other) assign(other.begin(), other.end());
    return *this;
  }
  Shape& operator=(Shape&& other) noexcept {
    if (this != &other) {
      release();
      take(other);
    }
    return *this;
  }
  Shape& operator=(std::initializer_list<value_type> values) {
    assign(values.begin(), values.end());
    return *this;
  }
  ~Shape() { release(); }

  template <std::input_iterator It>
  void assign(It first, It last) {
    size_ = 0;
    for (; first != last; ++first) push_back(*first);
  }
  void assign(size_type count, value_type value) {
    size_ = 0;
    resize(count, value);
  }

  value_type* data() { return heap_ ? heap_ : inline_; }
  const value_type* data() const { return heap_ ? heap_ : inline_; }
  size_type size() const { return size_; }
  size_type capacity() const { return heap_ ? capacity_ : inline_capacity; }
  bool empty() const { return size_ == 0; }

  iterator begin() { return data(); }
  iterator end() { return data() + size_; }
  const_iterator begin() const { return data(); }
  const_iterator end() const { return data() + size_; }
  const_iterator cbegin() const { return begin(); }
  const_iterator cend() const { return end(); }
  reverse_iterator rbegin() { return reverse_iterator(end()); }
  reverse_iterator rend() { return reverse_iterator(begin()); }
  const_reverse_iterator rbegin() const { return const_reverse_iterator(end()); }
  const_reverse_iterator rend() const { return const_reverse_iterator(begin()); }

  value_type& operator[](size_type i) { return data()[i]; }
  const value_type& operator[](size_type i) const { return data()[i]; }
  value_type& at(size_type i) {
    if (i >= size_) throw std::out_of_range("Shape::at: index out of range");
    return data()[i];
  }
  const value_type& at(size_type i) const { return const_cast<Shape*>(this)->at(i); }
  value_type& front() { return data()[0]; }
  const value_type& front() const { return data()[0]; }
  value_type& back() { return data()[size_ - 1]; }
  const value_type& back() const { return data()[size_ - 1]; }

  void reserve(size_type n) {
    if (n <= capacity()) return;
    auto* grown = new value_type[n];
    std::memcpy(grown, data(), size_ * sizeof(value_type));
    delete[] heap_;
    heap_ = grown;
    capacity_ = n;
  }
  void resize(size_type n, value_type value = 0) {
    reserve(n);
    for (size_type i = size_; i < n; ++i) data()[i] = value;
    size_ = n;
  }
  void clear() { size_ = 0; }
  void push_back(value_type v) {
    if (size_ == capacity()) reserve(2 * capacity());
    data()[size_++] = v;
  }
  void emplace_back(value_type v) { push_back(v); }
  void pop_back() { --size_; }

  iterator insert(const_iterator pos, value_type v) { return insert(pos, &v, &v + 1); }
  iterator insert(const_iterator pos, size_type count, value_type v) {
    const Shape values(count, v);
    return insert(pos, values.begin(), values.end());
  }
  iterator insert(const_iterator pos, std::initializer_list<value_type> values) {
    return insert(pos, values.begin(), values.end());
  }
  template <std::input_iterator It>
  iterator insert(const_iterator pos, It first, It last) {
    const Shape values(first, last);  // a copy first: [first, last) may lie in *this
    const size_type at = static_cast<size_type>(pos - begin());
    const size_type n = values.size();
    reserve(size_ + n);
    std::memmove(data() + at + n, data() + at, (size_ - at) * sizeof(value_type));
    std::memcpy(data() + at, values.data(), n * sizeof(value_type));
    size_ += n;
    return begin() + at;
  }
  iterator erase(const_iterator pos) { return erase(pos, pos + 1); }
  iterator erase(const_iterator first, const_iterator last) {
    const size_type at = static_cast<size_type>(first - begin());
    const size_type n = static_cast<size_type>(last - first);
    std::memmove(data() + at, data() + at + n, (size_ - at - n) * sizeof(value_type));
    size_ -= n;
    return begin() + at;
  }

  operator std::span<const value_type>() const { return {data(), size_}; }
  std::vector<value_type> to_vector() const { return {begin(), end()}; }

  friend bool operator==(const Shape& a, const Shape& b) { return std::ranges::equal(a, b); }
  friend auto operator<=>(const Shape& a, const Shape& b) {
    return std::lexicographical_compare_three_way(a.begin(), a.end(), b.begin(), b.end());
  }

 private:
  void release() {
    delete[] heap_;
    heap_ = nullptr;
    size_ = 0;
  }
  // Moves other's values here (this holds none) and leaves other empty.
  void take(Shape& other) noexcept {
    if (other.heap_) {
      heap_ = other.heap_;
      capacity_ = other.capacity_;
      other.heap_ = nullptr;
    } else {
      std::memcpy(inline_, other.inline_, other.size_ * sizeof(value_type));
    }
    size_ = other.size_;
    other.size_ = 0;
  }

  value_type* heap_ = nullptr;  // set once more than inline_capacity values were held
  size_type size_ = 0;
  size_type capacity_ = 0;      // of heap_
  value_type inline_[inline_capacity];
};

}  // namespace headgrad
